"""kernels/hopper/hopper_attn.py on a Hopper GPU: the four schedules and the other tilings against the float64 reference.

tests/test_attention_gpu.py runs the attention grid on the default builds (kernels.hopper.hopper_attn.default_tiles, overlap
and ping-pong on, persistent CTAs without the causal mask). Here every build of kernels.hopper.hopper_attn.SCHEDULES (overlap
on/off x ping-pong on/off), both launches (a CTA per SM walking the work tiles, a CTA per work tile) and the default
schedule with the tilings the launcher does not pick by default (176- and 192-key tiles under the causal mask, a
third ring slot, ...) get the shapes that stress the parts they change: one K/V tile (the pipelined loop is only its
prologue and tail), two (one pass of the loop), many (the rings wrap and the mbarrier phases flip), causal CTAs whose
tiles differ in count, Tq > Tk under the causal mask (rows and whole CTAs that see no key), a negative scale (the
softmax's maxima of scaled scores), and more work tiles than SMs (a persistent CTA walks several). The build without
lazy rescaling gets the same shapes, and both builds get rows whose maximum climbs from tile to tile, by less and by
more than the slack the lazy rescaling allows. Outputs start as NaN, so a row the kernel does not write fails. Needs compute capability 9.x; skipped elsewhere with the reason.
"""

import re

import numpy as np
import pytest

import kernels
import reference as R
from kernels.hopper import hopper_attn as A

# (B, H, Tq, Tk, d, causal, dtype, scale): what each case exercises
CASES = [
    (1, 1, 128, 128, 64, False, "float16", None),     # one K/V tile: prologue and tail only
    (1, 2, 200, 256, 128, True, "float16", None),     # two tiles, causal, a ragged query tile
    (2, 2, 1000, 1100, 64, True, "bfloat16", None),   # nine 128-key tiles: the 4-slot rings wrap twice
    (1, 2, 700, 1500, 128, False, "bfloat16", None),  # nine 176-key tiles: the 2-slot rings wrap four times
    (1, 2, 300, 100, 128, True, "float16", None),     # Tq > Tk, causal: rows and a CTA that see no key
    (1, 1, 300, 700, 64, False, "float16", -0.1),     # a negative scale
    (1, 2, 1500, 1500, 64, True, "float16", None),    # causal with 192-row tiles (Tq > SHORT_CAUSAL_TQ)
    (2, 40, 1000, 1000, 64, False, "bfloat16", None),  # 480 work tiles: a persistent CTA walks three or four
    (2, 24, 700, 900, 128, False, "float16", None),    # 288 work tiles at d = 128
]


# Tilings the launcher does not use by default, per head dimension (each also a build of its own)
OTHER_TILES = {64: [A.Tiles(128, 128, 4), A.Tiles(192, 128, 2), A.Tiles(128, 176, 4)],
               128: [A.Tiles(128, 176, 2), A.Tiles(128, 128, 3), A.Tiles(128, 192, 2)]}


def _check(cp, case, **options):
    B, H, Tq, Tk, d, causal, dtype, scale = case
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, seed=Tq + Tk + d)
    dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
    host = [x.get().astype(np.float64) for x in dev]
    o, lse = A.forward(*dev, causal=causal, scale=scale, return_lse=True, **options)
    o_ref, lse_ref = R.attention(*host, causal=causal, scale=scale, return_lse=True)
    res_o, res_lse = kernels.check(o, o_ref, dtype), kernels.check(lse, lse_ref, dtype)
    assert res_o.ok, f"o: {res_o}"
    assert res_lse.ok, f"lse: {res_lse}"
    if causal and Tq > Tk:  # rows i with i + Tk - Tq < 0 see no key: o = 0, lse = -inf
        blind = Tq - Tk
        assert bool((o[:, :, :blind] == 0).all()) and bool(cp.isneginf(lse[:, :, :blind]).all())


@pytest.mark.parametrize("schedule", sorted(A.SCHEDULES), ids=lambda s: f"overlap{int(s[0])}-pingpong{int(s[1])}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_schedule_matches_reference(hopper, poison, schedule, case):
    overlap, pingpong = schedule
    _check(hopper, case, overlap=overlap, pingpong=pingpong)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_without_lazy_rescaling_matches_reference(hopper, poison, case):
    _check(hopper, case, lazy_rescale=False)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("d, causal, climb", [(64, False, 40.0), (64, True, 40.0), (128, False, 40.0),
                                              (128, True, 6.0), (64, False, -40.0)])
def test_climbing_row_maxima(hopper, poison, lazy, d, causal, climb):
    """Scores that rise along the keys by `climb` log2 units in all (falling when negative): with 40 the row maximum
    passes the kept one by more than 8 every few tiles (a rescale), and by less in between (kept); with 6 it never
    passes it by 8 after the first tile, so p grows towards 2^6 against the stale maximum."""
    cp = hopper
    B, H, Tq, Tk = 1, 2, 300, 1700
    scale = d ** -0.5
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, seed=d + Tk)
    q, k = q * 0.1, k * 0.1
    q[..., 0] = 1.0
    k[..., 0] += climb / (scale * A.LOG2E) * np.arange(Tk) / Tk  # q_i . k_j grows by `climb` log2 units over Tk keys
    dtype = "float16"
    dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
    host = [x.get().astype(np.float64) for x in dev]
    o, lse = A.forward(*dev, causal=causal, return_lse=True, lazy_rescale=lazy)
    o_ref, lse_ref = R.attention(*host, causal=causal, return_lse=True)
    res_o, res_lse = kernels.check(o, o_ref, dtype), kernels.check(lse, lse_ref, dtype)
    assert res_o.ok, f"o: {res_o}"
    assert res_lse.ok, f"lse: {res_lse}"


@pytest.mark.parametrize("persistent", [False, True], ids=["grid", "persistent"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_persistent_and_grid_launches_match_reference(hopper, poison, persistent, case):
    _check(hopper, case, persistent=persistent)


@pytest.mark.parametrize("case, tiles", [(c, t) for c in CASES for t in OTHER_TILES[c[4]]],
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, A.Tiles) else "-".join(map(str, x)))
def test_other_tilings_match_reference(hopper, poison, case, tiles):
    _check(hopper, case, tiles=tiles)


@pytest.mark.parametrize("tiles, words", [
    ((64, 128, 2), "tiles.block_m=64"),
    ((128, 160, 2), "tiles.block_n=160"),
    ((128, 128, 1), "tiles.stages=1"),
    ((128, 192, 3), "shared memory"),
])
def test_bad_tiles_raise(hopper, tiles, words):
    cp = hopper
    x = cp.zeros((1, 1, 64, 128), cp.float16)
    with pytest.raises(ValueError, match=re.escape(words)):
        A.forward(x, x, x, tiles=tiles)
