"""Chapters 11-12, the parts that run on PyTorch tensors: FlashAttention-2 forward and backward in Triton
(flash2_triton.py, flash2_triton_kernels.py) and the course's kernels as torch.library custom operators
(torch_ops.py).

Importing this folder imports neither torch nor Triton: flash2_triton imports them when it launches, and torch_ops,
which registers operators with torch as it is imported, is imported by whoever uses it
(`from kernels.pytorch import torch_ops`)."""

from . import flash2_triton  # noqa: F401
