"""The decoding launchers' pure-Python parts, on the CPU: the split heuristic, the build tables and the registry."""

import math

import pytest

import kernels
from kernels.inference import decode_ft, decode_split
from kernels.inference.decode_split import choose_num_splits


def test_decoding_variants_are_registered_by_their_modules():
    assert set(kernels.DECODE_REGISTRY) == {"decode_ft", "decode_split", "decode_split_mma"}
    for var in kernels.DECODE_REGISTRY.values():
        assert var.module == f"kernels.inference.{var.name.removesuffix('_mma')}" and var.notebook == "08_decoding_kv_cache"
        assert var.dtypes and var.head_dims and var.max_tq >= 4
    assert kernels.DECODE_REGISTRY["decode_split"].paged and kernels.DECODE_REGISTRY["decode_split"].splits
    assert not kernels.DECODE_REGISTRY["decode_ft"].paged
    with pytest.raises(ValueError, match="registered twice"):
        kernels.register_decode(kernels.DECODE_REGISTRY["decode_ft"])


def test_one_split_when_one_split_fills_the_gpu():
    assert choose_num_splits(528, 4096, 528, tile=64) == 1
    assert choose_num_splits(8192, 2048, 528, tile=64) == 1
    assert choose_num_splits(1, 64, 528, tile=64) == 1  # one step of keys: nothing to split


def test_batch_one_fills_the_slots():
    """A few KV heads of a long sequence: the splits fill most of the slots, in one wave."""
    s = choose_num_splits(8, 32768, 396, tile=32)
    assert 8 * s <= 396 and 8 * s >= 0.8 * 396
    s = choose_num_splits(32, 4096, 528, tile=64)
    assert 32 * s <= 528 and 32 * s >= 0.8 * 528


@pytest.mark.parametrize("slots", [132, 396, 528, 1056])
@pytest.mark.parametrize("n_keys", [100, 2048, 4096, 32768])
def test_splits_never_grow_with_more_blocks(slots, n_keys):
    prev = math.inf
    for blocks in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096):
        s = choose_num_splits(blocks, n_keys, slots, tile=32)
        assert 1 <= s <= min(decode_split.MAX_SPLITS, math.ceil(n_keys / 32))
        assert s <= prev
        prev = s
    assert s == 1  # 4096 blocks fill any of these GPUs many times over


def test_the_fewest_splits_within_the_tolerance_of_the_best():
    """S is the smallest split count whose modelled cost waves(S) * (keys(S) + overhead) is within the tolerance of
    the cheapest over every allowed S."""
    for blocks, n_keys, slots, tile in [(8, 32768, 396, 32), (128, 4096, 528, 64), (512, 2048, 528, 64),
                                        (96, 8192, 264, 32), (3, 1000, 132, 16), (1024, 32768, 396, 32)]:
        s = choose_num_splits(blocks, n_keys, slots, tile=tile)
        cost = lambda S: math.ceil(blocks * S / slots) * (math.ceil(math.ceil(n_keys / S) / tile) * tile  # noqa: E731
                                                           + decode_split.SPLIT_OVERHEAD_KEYS)
        allowed = range(1, min(decode_split.MAX_SPLITS, math.ceil(n_keys / tile)) + 1)
        bound = min(cost(S) for S in allowed) * (1 + decode_split.SPLIT_TOLERANCE)
        assert cost(s) <= bound and all(cost(S) > bound for S in allowed if S < s)
    assert choose_num_splits(8, 32768, 396, tile=32, tolerance=0.0) == 49  # the exact minimum: 392 of 396 slots


def test_heuristic_argument_errors():
    with pytest.raises(ValueError, match=r"blocks, slots and tile must be >= 1; got 0, 10, 4"):
        choose_num_splits(0, 100, 10, tile=4)


def test_row_builds_and_steps():
    assert [decode_split.rows_build(r) for r in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert decode_split.keys_per_step(128, 1) == 8 * 4 * 2  # UNROLL * warps * keys per warp load
    assert decode_split.keys_per_step(64, 8) == 2 * 4 * 4
    exprs = decode_split.NVRTC_BUILDS[0][0]
    for D in decode_split.HEAD_DIMS:
        for rb in decode_split.ROW_BUILDS:
            for dt in decode_split.DTYPES:
                assert decode_split.name_expression(D, rb, dt) in exprs
            assert decode_split.mma_expression(D, dt) in exprs


def test_tensor_core_plan():
    """The tensor-core kernel's plan: 16 rows per block (row chunks of 16), 16 keys per warp tile (the default); the
    CUDA-core kernel's; the tensor-core kernel's shared memory (each warp's K and V tiles, all stages)."""
    S = 3  # given, so that the plan needs no GPU
    assert decode_split.plan(2, 32, 1, 128, 8, 4096, "float16", num_splits=S, tensor_cores=True) == (16, 1, 64, S)
    assert decode_split.plan(2, 16, 4, 64, 2, 4096, "bfloat16", num_splits=S, tensor_cores=True) == (16, 2, 64, S)
    assert decode_split.plan(2, 32, 1, 128, 8, 4096, "float16", num_splits=S, tensor_cores=False) == (4, 1, 32, S)
    assert decode_split.plan(2, 32, 1, 128, 32, 4096, "float16", num_splits=S) == (16, 1, 64, S)
    assert decode_split.plan(2, 32, 1, 128, 32, 4096, "float16", num_splits=S, tensor_cores=False) == (1, 1, 64, S)
    assert decode_split.mma_smem_bytes(128) == 4 * 2 * 2 * 16 * 128 * 2 == 64 * 1024


def test_ft_helpers():
    assert decode_ft.chunk_elems("float16") == 8 and decode_ft.chunk_elems("float32") == 4
    assert decode_ft.tpk_choices(128, "float16") == (1, 2, 4, 8, 16)
    assert decode_ft.tpk_choices(128, "float32") == (1, 2, 4, 8, 16, 32)
    assert decode_ft.tpk_choices(64, "float16") == (1, 2, 4, 8)
    built = decode_ft.NVRTC_BUILDS[0][0]
    for d in decode_ft.HEAD_DIMS:
        for dt in decode_ft.DTYPES:
            assert decode_ft.DEFAULT_TPK in decode_ft.tpk_choices(d, dt)
            assert decode_ft.name_expression(d, dt, decode_ft.DEFAULT_TPK, False) in built
