"""Chapter 13: Hopper's TMA, mbarriers and wgmma from raw PTX, built for sm_90a: a GEMM (hopper_gemm.cu) and
FlashAttention-3's forward on those pieces (hopper_attn.cu), and a first version of its backward (hopper_attn_bwd.cu)."""

from . import hopper_gemm, hopper_attn, hopper_attn_bwd  # noqa: F401
