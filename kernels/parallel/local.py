"""The local attention the context-parallel schedules are written against, its two backends, and the merge by LSE.

    backend.forward(q, k, v, causal, scale) -> (o, lse)                 attention of q on these keys only
    backend.backward(do, q, k, v, o, lse, causal, scale) -> (dq, dk, dv)

q, do, o (B, H, Tq, d) and k, v (B, H, Tk, d) are contiguous torch tensors; causal is bottom-right aligned (only ever
used here with Tq == Tk, where it is the plain lower triangle). In the backward, o and lse are the *merged* output and
log-sum-exp of the whole sequence, not of this block: with them P = exp(S - lse) is the block's slice of the global
softmax, and D = rowsum(dO * O) is the global one, so the block's dQ, dK, dV are exact parts of the sums.

    ReferenceLocal   float64 NumPy from reference/ on CPU tensors (float32 or float64): what the gloo tests run
    CudaLocal        the course's kernels on CUDA tensors (float16, bfloat16): the forward with its LSE and the
                     backward of the torch operators of kernels/pytorch/torch_ops.py (torch's stream and caching
                     allocator): flash2_mma and flash2_mma_bwd, or on a Hopper the kernels forward_kernel and
                     backward_kernel pick there

Importing this module needs torch; CudaLocal needs CuPy and a GPU only when it is made.
"""

from __future__ import annotations

import numpy as np
import torch

import reference


def merge_(o_acc, lse_acc, o, lse) -> None:
    """o_acc, lse_acc <- the merge of (o_acc, lse_acc) and (o, lse), in place, in o_acc's dtype (float32 on GPU):

        lse' = log(exp(lse_acc) + exp(lse)),   o' = exp(lse_acc - lse') o_acc + exp(lse - lse') o

    A row that has seen nothing yet has lse = -inf and o = 0; where both are -inf the row stays (0, -inf) instead of
    becoming NaN (exp(-inf - -inf))."""
    lse = lse.to(lse_acc.dtype)
    new = torch.logaddexp(lse_acc, lse)  # the row terms: (B, H, T), d times smaller than o
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    o_acc.mul_(torch.exp(lse_acc - safe).unsqueeze(-1))  # two passes over o_acc, o read once in its own dtype
    o_acc.addcmul_(o, torch.exp(lse - safe).unsqueeze(-1))
    lse_acc.copy_(new)


class ReferenceLocal:
    """Float64 attention on the CPU (reference/): the oracle as the local kernel."""
    name = "reference"
    dtypes = (torch.float32, torch.float64)
    acc_dtype = torch.float64
    device_type = "cpu"

    def forward(self, q, k, v, causal: bool, scale: float):
        o, lse = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, scale=scale, return_lse=True)
        return torch.from_numpy(o), torch.from_numpy(lse)

    def backward(self, do, q, k, v, o, lse, causal: bool, scale: float):
        """dV = P^T dO, dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, with P = exp(S - lse) from the
        global lse (reference.attention_backward would renormalise over this block's keys only: wrong here)."""
        q64, k64, v64, do64, o64 = (t.numpy().astype(np.float64) for t in (q, k, v, do, o))
        s = reference.attention_scores(q64, k64, causal=causal, scale=scale)
        lse64 = lse.numpy().astype(np.float64)[..., None]
        p = np.exp(s - np.where(np.isfinite(lse64), lse64, 0.0))  # masked scores are -inf: p = 0
        delta = (do64 * o64).sum(-1, keepdims=True)
        ds = p * (do64 @ np.swapaxes(v64, -1, -2) - delta)
        dq = scale * (ds @ k64)
        dk = scale * (np.swapaxes(ds, -1, -2) @ q64)
        dv = np.swapaxes(p, -1, -2) @ do64
        return tuple(torch.from_numpy(x) for x in (dq, dk, dv))


class CudaLocal:
    """The course's tensor-core kernels on torch CUDA tensors (float16, bfloat16; d % 8 == 0, d <= 128)."""
    name = "cuda"
    dtypes = (torch.float16, torch.bfloat16)
    acc_dtype = torch.float32
    device_type = "cuda"

    def __init__(self):
        from ..pytorch import torch_ops  # CuPy, the launchers and the custom operators

        self.ops = torch_ops

    def forward(self, q, k, v, causal: bool, scale: float):
        return self.ops.flash_attn_fwd_impl(q, k, v, causal, scale)

    def backward(self, do, q, k, v, o, lse, causal: bool, scale: float):
        return self.ops.flash_attn_bwd(do, q, k, v, o, lse, None, causal, scale)


_BACKENDS: dict = {}


def backend_for(name_or_tensor) -> object:
    """The local backend by name ("reference", "cuda"), or the one for a tensor's device; one instance per process."""
    if isinstance(name_or_tensor, torch.Tensor):
        name = "cuda" if name_or_tensor.is_cuda else "reference"
    else:
        name = name_or_tensor
    if name not in ("reference", "cuda"):
        raise ValueError(f"backend must be 'reference' or 'cuda'; got {name!r}")
    if name not in _BACKENDS:
        _BACKENDS[name] = ReferenceLocal() if name == "reference" else CudaLocal()
    return _BACKENDS[name]
