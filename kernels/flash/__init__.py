"""Chapters 03, 04, 06 and 12: FlashAttention-1 (flash1.cu), FlashAttention-2 on CUDA cores (flash2.cu), on tensor
cores through WMMA (flash2_wmma.cu) and through mma.sync (flash2_mma.cu, also the varlen kernel of chapter 09), and
the FlashAttention-2 backward on mma.sync (flash2_mma_bwd.cu)."""

from . import flash1, flash2, flash2_wmma, flash2_mma, flash2_mma_bwd  # noqa: F401
