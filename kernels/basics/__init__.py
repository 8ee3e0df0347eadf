"""Chapters 01-02: attention as three naive kernels (naive.cu), softmax as a thread, a warp and a block per row
(softmax.cu), and the masked softmax's backward that chapter 12's operator uses (softmax_bwd.cu)."""

from . import naive, softmax, softmax_bwd  # noqa: F401
