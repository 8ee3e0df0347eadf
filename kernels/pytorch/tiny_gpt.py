"""The small GPT-style model of chapter 12, with its attention call passed in: what notebook 12 trains with our
operator and with SDPA, and what `python3 -m kernels.bench.torch_ops --parts train` times at larger sizes.

    model = TinyGPT(lambda q, k, v: torch_ops.attention(q, k, v, causal=True), C=1024, H=16).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = train_step(model, opt, batch)        # batch: (B, T + 1) int64 tokens; returns the loss tensor

Pre-norm transformer blocks (attention, then a 4x MLP) over byte tokens. The attention call takes q, k, v of shape
(B, H, T, C / H) in bfloat16 and returns the same shape; everything else runs in the model's own dtype (or under
whatever autocast the caller opens). Imports torch; importing kernels.pytorch does not import this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, C: int, H: int, attn):
        super().__init__()
        self.H, self.attn = H, attn
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.to(torch.bfloat16).contiguous().unbind(0)  # each (B, H, T, C / H)
        y = self.attn(q, k, v).to(x.dtype).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, attn, vocab: int = 256, C: int = 128, H: int = 4, L: int = 2, T: int = 128):
        super().__init__()
        if C % H:
            raise ValueError(f"the width C={C} must be a multiple of the head count H={H}")
        self.tok, self.pos = nn.Embedding(vocab, C), nn.Parameter(torch.zeros(T, C))
        self.blocks = nn.ModuleList(Block(C, H, attn) for _ in range(L))
        self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, vocab)

    def forward(self, idx):
        if idx.shape[1] > self.pos.shape[0]:
            raise ValueError(f"a sequence of {idx.shape[1]} tokens is longer than the model's T={self.pos.shape[0]}")
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def train_step(model: TinyGPT, opt, batch, autocast_dtype=None):
    """One step of next-token prediction on batch (B, T + 1): forward, cross-entropy, backward, optimizer step.
    autocast_dtype (torch.bfloat16, say) runs the forward under torch.autocast with it (the backward follows the
    forward's dtypes). Returns the loss tensor (reading it with .item() waits for the GPU; the step itself does not)."""
    with torch.autocast("cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss
