"""Chapters 08-09: decoding one token over a KV cache (decode_ft.cu: FasterTransformer's kernel; decode_split.cu:
split-KV flash-decoding on CUDA and tensor cores; decode_append.cu: writing the new keys and values), and batches of
different lengths without padding (varlen.cu)."""

from . import decode_ft, decode_split, decode_append, varlen  # noqa: F401
