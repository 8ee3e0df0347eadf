"""kernels/hopper_attn.py on a Hopper GPU: the four schedules of the kernel against the float64 reference.

tests/test_attention_gpu.py runs the attention grid on the default build (overlap and ping-pong on). Here every
build of kernels.hopper_attn.SCHEDULES (overlap on/off x ping-pong on/off) gets the shapes that stress the parts the
schedules change: one K/V tile (the pipelined loop is only its prologue and tail), two (one pass of the loop), many
(the ring wraps and the mbarrier phases flip), causal CTAs whose tiles differ in count, Tq > Tk under the causal mask
(rows and whole CTAs that see no key), and a negative scale (the softmax's maxima of scaled scores). Outputs start as
NaN, so a row the kernel does not write fails. Needs compute capability 9.x; skipped elsewhere with the reason.
"""

import numpy as np
import pytest

import kernels
import reference as R
from kernels import hopper_attn as A

# (B, H, Tq, Tk, d, causal, dtype, scale): what each case exercises
CASES = [
    (1, 1, 128, 128, 64, False, "float16", None),     # one K/V tile: prologue and tail only
    (1, 2, 200, 256, 128, True, "float16", None),     # two tiles, causal, a ragged query tile
    (2, 2, 1000, 1100, 64, True, "bfloat16", None),   # nine tiles: the 4-slot ring wraps twice
    (1, 2, 700, 1500, 128, False, "bfloat16", None),  # twelve tiles: the 3-slot ring wraps four times
    (1, 2, 300, 100, 128, True, "float16", None),     # Tq > Tk, causal: rows and a CTA that see no key
    (1, 1, 300, 700, 64, False, "float16", -0.1),     # a negative scale
]


@pytest.mark.parametrize("schedule", sorted(A.SCHEDULES), ids=lambda s: f"overlap{int(s[0])}-pingpong{int(s[1])}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_schedule_matches_reference(hopper, poison, schedule, case):
    cp = hopper
    B, H, Tq, Tk, d, causal, dtype, scale = case
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, seed=Tq + Tk + d)
    dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
    host = [x.get().astype(np.float64) for x in dev]
    overlap, pingpong = schedule
    o, lse = A.forward(*dev, causal=causal, scale=scale, return_lse=True, overlap=overlap, pingpong=pingpong)
    o_ref, lse_ref = R.attention(*host, causal=causal, scale=scale, return_lse=True)
    res_o, res_lse = kernels.check(o, o_ref, dtype), kernels.check(lse, lse_ref, dtype)
    assert res_o.ok, f"o: {res_o}"
    assert res_lse.ok, f"lse: {res_lse}"
    if causal and Tq > Tk:  # rows i with i + Tk - Tq < 0 see no key: o = 0, lse = -inf
        blind = Tq - Tk
        assert bool((o[:, :, :blind] == 0).all()) and bool(cp.isneginf(lse[:, :, :blind]).all())
