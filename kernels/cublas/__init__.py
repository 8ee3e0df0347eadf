"""Chapters 05-06: attention as cuBLAS GEMMs around a softmax, llm.c's v3 and v4 in float32 (cublas_attention.cu) and
v5 and v6 in 16 bits (cublas_half.cu)."""

from . import cublas_attention, cublas_half  # noqa: F401
