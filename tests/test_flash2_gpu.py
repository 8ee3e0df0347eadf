"""What the registry grid does not cover for the tiled kernels: any head size, misaligned inputs, the tiles of the
sweep that chose flash2's defaults (any of which may become a default; kernels/flash/README.md), and LSE with
magnitude-10 inputs."""

import pytest

import kernels
import reference as R
from kernels.flash import flash1 as F1
from kernels.flash import flash2 as F2

SWEEP_TILES = {64: [(128, 64, 8, 8), (64, 64, 8, 8), (128, 64, 4, 8), (32, 64, 4, 8), (64, 32, 4, 4), (128, 32, 8, 4)],
               128: [(128, 64, 8, 4), (64, 64, 4, 8), (32, 32, 4, 4)]}
ODD = [(100, 100, 24), (77, 200, 5), (200, 77, 100), (257, 257, 1), (64, 64, 127), (33, 7, 3)]


@pytest.mark.parametrize("forward", [F1.forward, F2.forward], ids=["flash1", "flash2_fp32"])
@pytest.mark.parametrize("Tq,Tk,d", ODD)
@pytest.mark.parametrize("causal", [False, True])
def test_any_head_size(gpu, poison, forward, Tq, Tk, d, causal):
    cp = gpu
    q, k, v = R.make_qkv(1, 2, Tq, d, Tk, magnitude=3.0, seed=Tq + d)
    o, lse = forward(*map(cp.asarray, (q, k, v)), causal=causal, return_lse=True)
    o_ref, lse_ref = R.attention(q, k, v, causal=causal, return_lse=True)
    assert kernels.check(o, o_ref).ok and kernels.check(lse, lse_ref).ok


def test_flash2_misaligned_inputs_take_the_scalar_path(gpu, poison):
    cp = gpu
    q, k, v = R.make_qkv(2, 2, 45, 32, seed=3)
    shifted = []
    for x in (q, k, v):
        base = cp.empty(x.size + 1, dtype=cp.float32)
        view = base[1:].reshape(x.shape)  # 4 bytes past a 16-byte boundary
        view[...] = cp.asarray(x)
        shifted.append(view)
    assert kernels.check(F2.forward(*shifted, causal=True), R.attention(q, k, v, causal=True)).ok


# Each tile is a build of its own. By default, per D, tiles that between them take every value of each of BR, BC, TM and
# TN the sweep tried; --full-grid: every tile.
SWEEP_DEFAULT = {64: [(128, 64, 8, 8), (32, 64, 4, 8), (64, 32, 4, 4)], 128: SWEEP_TILES[128]}


@pytest.mark.parametrize("D,tile", [pytest.param(D, t, id=f"{D}-tile{i}",
                                                 marks=() if t in SWEEP_DEFAULT[D] else (pytest.mark.full_grid,))
                                    for i, (D, t) in enumerate((D, t) for D, ts in SWEEP_TILES.items() for t in ts)])
def test_flash2_sweep_tiles(gpu, poison, D, tile):
    if F2.Flash2Tile(*tile).smem_bytes(D) > kernels.core.max_shared_memory_optin():  # a T4's 64 KB (test_sm75_gpu.py)
        pytest.skip(f"tile {tile} for D={D} needs more shared memory per block than this GPU allows")
    cp = gpu
    for (Tq, Tk), d, causal in [((33, 33), D, True), ((100, 257), D - 28, False), ((257, 100), D, True),
                                ((130, 130), D - 28, True)]:
        q, k, v = R.make_qkv(1, 2, Tq, d, Tk, magnitude=3.0, seed=Tq + d)
        o, lse = F2.forward(*map(cp.asarray, (q, k, v)), causal=causal, return_lse=True, tile=tile)
        o_ref, lse_ref = R.attention(q, k, v, causal=causal, return_lse=True)
        res = kernels.check(o, o_ref)
        assert res.ok and kernels.check(lse, lse_ref).ok, (tile, Tq, Tk, d, causal, res.detail())


def test_flash2_bad_tile_is_a_value_error(gpu):
    cp = gpu
    q = cp.ones((1, 1, 8, 64), cp.float32)
    with pytest.raises(ValueError, match=r"BC/TN = 3 must be a power of two"):
        F2.forward(q, q, q, tile=(64, 48, 4, 16))
