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

The default grid runs a covering part of the schedules x shapes and tilings x shapes (SCHEDULE_DEFAULT_BUILDS,
_launch_cases, OTHER_TILINGS_DEFAULT below); `pytest --full-grid` runs all of them.
"""

import functools
import itertools
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
    (1, 2, 700, 900, 256, False, "bfloat16", None),   # d = 256: fifteen 64-key tiles, O += P V in two halves
    (1, 2, 300, 500, 256, True, "float16", -0.1),     # d = 256, causal, a negative scale
]


# Tilings the launcher does not use by default, per head dimension (each also a build of its own)
OTHER_TILES = {64: [A.Tiles(128, 128, 4), A.Tiles(192, 128, 2), A.Tiles(128, 176, 4)],
               128: [A.Tiles(128, 176, 2), A.Tiles(128, 128, 3), A.Tiles(128, 192, 2)],
               256: []}  # at d = 256 only the default tiling fits 227 KB


@functools.lru_cache(maxsize=None)
def _inputs_and_reference(case):
    """q, k, v of a case in its dtype (host arrays) and the float64 reference on exactly those values. Computed once
    per case: every schedule, launch and tiling of a case compares with the same reference, and the largest cases
    spend seconds in it (B * H = 80 heads of 1000 x 1000 scores)."""
    B, H, Tq, Tk, d, causal, dtype, scale = case
    inputs = [x.astype(dtype) for x in R.make_qkv(B, H, Tq, d, Tk, seed=Tq + Tk + d)]
    o_ref, lse_ref = R.attention(*(x.astype(np.float64) for x in inputs), causal=causal, scale=scale, return_lse=True)
    return inputs, o_ref, lse_ref


@pytest.fixture(scope="module", autouse=True)
def _drop_cached_references():
    yield
    _inputs_and_reference.cache_clear()


def _check(cp, case, **options):
    B, H, Tq, Tk, d, causal, dtype, scale = case
    inputs, o_ref, lse_ref = _inputs_and_reference(case)
    dev = [cp.asarray(x) for x in inputs]
    o, lse = A.forward(*dev, causal=causal, scale=scale, return_lse=True, **options)
    res_o, res_lse = kernels.check(o, o_ref, dtype), kernels.check(lse, lse_ref, dtype)
    assert res_o.ok, f"o: {res_o}"
    assert res_lse.ok, f"lse: {res_lse}"
    if causal and Tq > Tk:  # rows i with i + Tk - Tq < 0 see no key: o = 0, lse = -inf
        blind = Tq - Tk
        assert bool((o[:, :, :blind] == 0).all()) and bool(cp.isneginf(lse[:, :, :blind]).all())


def _case_id(case):
    return "-".join(map(str, case))


def _build(case):
    """(d, tiling) of the default build a case runs on: default_tiles(d, causal, Tq)."""
    return case[4], A.default_tiles(case[4], case[5], case[2])


# The default grid runs every case on the default schedule (overlap and ping-pong on: the build the attention grid uses
# too) and each other schedule on two of the four default tilings: d = 64's 192-row tiles (three consumer warpgroups:
# one K/V tile, a negative scale, causal 192-row tiles, a persistent CTA walking several work tiles) and one tiling
# of two consumer warpgroups, a different one per schedule (d = 128 without the mask; d = 128 under the mask, with
# rows and a CTA that see no key; d = 64's short causal tiles, bf16, the rings wrapping). --full-grid: every case on
# every schedule.
SCHEDULE_DEFAULT_BUILDS = {
    (False, False): {(64, A.TILES[(64, False)]), (128, A.TILES[(128, False)]), (256, A.TILES[(256, False)])},
    (False, True): {(64, A.TILES[(64, False)]), (128, A.TILES[(128, True)])},
    (True, False): {(64, A.TILES[(64, False)]), (64, A.SHORT_CAUSAL_TILES)},
}


def _schedule_cases():
    for case, schedule in itertools.product(CASES, sorted(A.SCHEDULES)):
        default = schedule == (True, True) or _build(case) in SCHEDULE_DEFAULT_BUILDS[schedule]
        yield pytest.param(schedule, case, id=f"{_case_id(case)}-overlap{int(schedule[0])}-pingpong{int(schedule[1])}",
                           marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("schedule,case", list(_schedule_cases()))
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


def _launch_cases():
    """Each case with the launches it does not get by default (A.default_launch); the one it gets by default runs in
    test_schedule_matches_reference already, so here only under --full-grid."""
    for case, persistent in itertools.product(CASES, [False, True, "dynamic"]):
        is_default = persistent == A.default_launch(case[4], case[5])  # d, causal
        launch = persistent if isinstance(persistent, str) else "persistent" if persistent else "grid"
        yield pytest.param(persistent, case, id=f"{_case_id(case)}-{launch}",
                           marks=(pytest.mark.full_grid,) if is_default else ())


@pytest.mark.parametrize("persistent,case", list(_launch_cases()))
def test_persistent_and_grid_launches_match_reference(hopper, poison, persistent, case):
    _check(hopper, case, persistent=persistent)


# By default: the two tilings that are builds of their own and stress what nothing else does (192-key tiles, the widest
# wgmma; three ring slots, so the slot index and the mbarrier phase wrap at different times), each on a d = 128 case
# whose rings wrap, and two default builds on the other mask (the d = 128 non-causal tiling under the causal mask, the
# short-causal d = 64 tiling without it). --full-grid: every case with every tiling of OTHER_TILES.
OTHER_TILINGS_DEFAULT = {(CASES[3], A.Tiles(128, 192, 2)), (CASES[8], A.Tiles(128, 128, 3)),
                         (CASES[1], A.TILES[(128, False)]), (CASES[7], A.SHORT_CAUSAL_TILES)}


def _tiling_cases():
    for case in CASES:
        for tiles in OTHER_TILES[case[4]]:
            yield pytest.param(case, tiles, id=f"{_case_id(case)}-{'x'.join(map(str, tiles))}",
                               marks=() if (case, tiles) in OTHER_TILINGS_DEFAULT else (pytest.mark.full_grid,))


@pytest.mark.parametrize("case, tiles", list(_tiling_cases()))
def test_other_tilings_match_reference(hopper, poison, case, tiles):
    _check(hopper, case, tiles=tiles)


def test_bad_persistent_raises(hopper):
    cp = hopper
    x = cp.zeros((1, 1, 64, 128), cp.float16)
    with pytest.raises(ValueError, match=r"persistent='always': must be one of None, False, True, 'dynamic'"):
        A.forward(x, x, x, persistent="always")
    ids = cp.zeros((1, 64), cp.int32)
    with pytest.raises(ValueError, match=r"persistent='dynamic': must be one of None, False, True$"):
        A.forward(x, x, x, doc_ids_q=ids, persistent="dynamic")  # the variant kernels with documents: the first three
    y = cp.zeros((1, 1, 64, 256), cp.float16)
    with pytest.raises(ValueError, match=r"persistent='dynamic': must be one of None, False, True$"):
        A.forward(y, y, y, softcap=10.0, persistent="dynamic")  # and at d = 256


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
