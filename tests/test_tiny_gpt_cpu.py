"""kernels.pytorch.tiny_gpt, the model chapter 12 trains and `kernels.bench.torch_ops --parts train` times: on the CPU
with torch's own attention, a few steps lower the loss on a fixed batch, and bad shapes raise naming the limit."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from kernels.pytorch.tiny_gpt import TinyGPT, train_step  # noqa: E402


def _sdpa(q, k, v):
    assert q.dtype == torch.bfloat16 and q.shape[-1] == 8  # what the attention call receives: (B, H, T, C / H)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_train_steps_lower_the_loss():
    torch.manual_seed(0)
    model = TinyGPT(_sdpa, C=32, H=4, L=1, T=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = [train_step(model, opt, batch).item() for _ in range(20)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="C=30 must be a multiple of the head count H=4"):
        TinyGPT(_sdpa, C=30, H=4)
    model = TinyGPT(_sdpa, C=32, H=4, L=1, T=16)
    with pytest.raises(ValueError, match="17 tokens is longer than the model's T=16"):
        model(torch.zeros(1, 17, dtype=torch.int64))
