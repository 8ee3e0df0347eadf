"""kernels.bench.variants without a GPU: the grid, the visible-area count, FlexAttention's mask_mod and score_mod (plain
torch functions, evaluated on index grids) and the torch computation the GPU rows are checked against, all against
reference.variants; and the rows' ratios from made-up timings."""

import math

import numpy as np
import pytest

import reference.variants as RV
from kernels.bench import variants as BV
from kernels.core.timing import Timing

torch = pytest.importorskip("torch")

SMALL = dict(window1024=dict(window=(7, 0)))  # the same cases at a size where the window cuts


def small(case, **change):
    """The case with its window (and document count) scaled to small T."""
    from dataclasses import replace

    return replace(case, **{**SMALL.get(case.name, {}), **change})


def test_the_grid_is_the_issues():
    assert BV.TS == (4096, 16384) and (BV.B, BV.H, BV.D) == (4, 32, 128)
    assert [c.name for c in BV.CASES] == ["causal", "window1024", "docs8", "softcap30", "alibi", "gqa8", "d256"]
    c = BV.CASE
    assert c["window1024"].window == (1024, 0) and c["window1024"].causal and c["window1024"].target == "area"
    assert c["docs8"].docs == 8 and not c["docs8"].causal
    assert c["softcap30"].softcap == 30 and c["softcap30"].target == "causal" and c["alibi"].target == "causal"
    assert c["gqa8"].kv_heads(BV.H) == 8 and c["gqa8"].group() == 4 and c["gqa8"].kv_heads(8) == 2
    assert c["d256"].d == 256
    assert {n for n, x in c.items() if x.sdpa} == {"causal", "gqa8", "d256"}
    assert BV.IMPLS == ("flash2_mma", "hopper_attn", "flex", "sdpa_cudnn", "sdpa_flash")


def test_doc_ids_and_slopes():
    assert np.bincount(BV.doc_ids(4096, 8)).tolist() == [512] * 8
    ids = BV.doc_ids(1500, 8)
    assert ids.dtype == np.int32 and np.all(np.diff(ids) >= 0) and set(np.bincount(ids)) <= {187, 188}
    s = BV.alibi_slopes(8)
    assert s.dtype == np.float32 and np.allclose(s, [2.0 ** -(i + 1) for i in range(8)])


@pytest.mark.parametrize("T", [1, 5, 64, 100, 257])
@pytest.mark.parametrize("name", list(BV.CASE))
def test_visible_pairs_match_the_reference_mask(name, T):
    case = small(BV.CASE[name])
    opts = BV.variant_options(case, 1, 4, T)
    mask = RV.variant_mask(T, T, causal=case.causal, window=opts.get("window"), doc_ids_q=opts.get("doc_ids_q"))
    assert BV.visible_pairs(case, T) == int(mask.sum())


def test_visible_area_of_the_grid():
    T = 4096
    assert BV.visible_pairs(BV.CASE["causal"], T) == T * (T + 1) // 2
    assert BV.visible_pairs(BV.CASE["docs8"], T) == 8 * 512 ** 2
    assert BV.visible_pairs(BV.CASE["window1024"], T) == sum(min(i, 1024) + 1 for i in range(T))
    # the exact count agrees with the reference's block mask counted at 128-token tiles (a FULL tile is 128^2 pairs)
    for name in ("causal", "window1024", "docs8"):
        case = BV.CASE[name]
        opts = BV.variant_options(case, 1, 4, 1024)
        mask = RV.variant_mask(1024, 1024, causal=case.causal, window=opts.get("window"),
                               doc_ids_q=opts.get("doc_ids_q"))
        _, counts = RV.block_mask(mask, 128, 128)
        assert counts["full"] * 128 ** 2 <= BV.visible_pairs(case, 1024) <= \
            (counts["full"] + counts["partial"]) * 128 ** 2
    assert BV.flops(BV.CASE["d256"], T) == 4.0 * BV.B * BV.H * 256 * T * (T + 1) // 2


def grids(Tq, Tk, heads=1):
    return (torch.tensor(0), torch.arange(heads)[:, None, None], torch.arange(Tq)[:, None], torch.arange(Tk)[None, :])


@pytest.mark.parametrize("Tq, Tk", [(37, 37), (20, 53), (53, 20)])
@pytest.mark.parametrize("name", list(BV.CASE))
def test_mask_mod_is_the_reference_mask(name, Tq, Tk):
    case = small(BV.CASE[name], docs=BV.CASE[name].docs and 3)
    ids_q, ids_k = BV.doc_ids(Tq, 3), BV.doc_ids(Tk, 3)
    mod = BV.mask_mod(case, Tq, Tk, torch.from_numpy(ids_k) if case.docs else None)
    b, _, q, kv = grids(Tq, Tk)
    if case.docs:  # the mod indexes one id array: query and key ids agree only at Tq == Tk
        if Tq != Tk:
            pytest.skip("the grid's document mask is self-attention (Tq == Tk)")
    got = mod(b, torch.tensor(0), q, kv).numpy()
    want = RV.variant_mask(Tq, Tk, causal=case.causal, window=case.window,
                           doc_ids_q=ids_q if case.docs else None, doc_ids_k=ids_k if case.docs else None)
    assert got.shape == (Tq, Tk) and np.array_equal(got, want)


def test_no_mask_and_no_score_mod_where_the_case_has_none():
    plain = BV.Case("full", causal=False)
    assert BV.mask_mod(plain, 8, 8) is None and BV.score_mod(plain, 8, 8) is None
    with pytest.raises(ValueError, match="ids"):
        BV.mask_mod(BV.CASE["docs8"], 8, 8)
    with pytest.raises(ValueError, match="slopes"):
        BV.score_mod(BV.CASE["alibi"], 8, 8)


@pytest.mark.parametrize("name", ["softcap30", "alibi"])
def test_score_mod_is_the_references(name):
    """score_mod on the scaled scores, then the reference's softmax: the oracle's output (causal mask off, so the
    score modifications alone decide it)."""
    from dataclasses import replace

    case = replace(BV.CASE[name], causal=False, softcap=BV.CASE[name].softcap and 0.5)  # a cap that bites
    heads, Tq, Tk, d = 4, 24, 40, 16
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, heads, T, d)) for T in (Tq, Tk, Tk))
    slopes = BV.alibi_slopes(heads)
    mod = BV.score_mod(case, Tq, Tk, torch.from_numpy(slopes))
    s = torch.from_numpy(q[0] @ k[0].transpose(0, 2, 1) / math.sqrt(d))
    b, h, qi, kv = grids(Tq, Tk, heads)
    s = mod(s, b, h, qi, kv).numpy()
    p = np.exp(s - s.max(-1, keepdims=True))
    got = (p / p.sum(-1, keepdims=True)) @ v[0]
    want = RV.attention_variant(q, k, v, softcap=case.softcap, alibi_slopes=slopes if case.alibi else None)[0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(BV.CASE))
def test_torch_attention_is_the_oracle(name):
    """The computation the GPU rows are checked against, in float64 on the CPU: the oracle, for every case (GQA with
    4 query heads per kv head, fully masked rows of a window with Tq > Tk excluded: the grid is Tq == Tk)."""
    case = small(BV.CASE[name], d=16, docs=BV.CASE[name].docs and 3)
    batch, heads, T = 2, 8, 45
    rng = np.random.default_rng(2)
    q = rng.standard_normal((batch, heads, T, case.d))
    k, v = (rng.standard_normal((batch, case.kv_heads(heads), T, case.d)) for _ in range(2))
    opts = BV.variant_options(case, batch, heads, T)
    ids = torch.from_numpy(BV.doc_ids(T, 3)) if case.docs else None
    slopes = torch.from_numpy(opts["alibi_slopes"]) if case.alibi else None
    got = BV.torch_attention(*(torch.from_numpy(x) for x in (q, k, v)), case, ids, slopes).numpy()
    want = RV.attention_variant(q, k, v, **opts)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_flex_block_mask_counts_are_the_references():
    """create_block_mask (CPU) on the mask_mod gives the reference block mask's EMPTY / FULL / PARTIAL counts."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    T, blk = 1024, 128
    for name in ("causal", "window1024", "docs8"):
        case = small(BV.CASE[name], window=(200, 0)) if name == "window1024" else BV.CASE[name]
        ids = BV.doc_ids(T, case.docs) if case.docs else None
        mod = BV.mask_mod(case, T, T, torch.from_numpy(ids) if case.docs else None)
        bm = fa.create_block_mask(mod, None, None, T, T, device="cpu", BLOCK_SIZE=blk)
        _, counts = RV.block_mask(RV.variant_mask(T, T, causal=case.causal, window=case.window, doc_ids_q=ids),
                                  blk, blk)
        full = int(bm.full_kv_num_blocks.sum()) if bm.full_kv_num_blocks is not None else 0
        assert (full, int(bm.kv_num_blocks.sum())) == (counts["full"], counts["partial"]), name


def fake(rounds):
    return Timing(ms=float(np.median(rounds)), min_ms=min(rounds), max_ms=max(rounds), call_ms=max(rounds),
                  call_min_ms=0.0, call_max_ms=0.0, rounds=list(rounds))


def test_rows_carry_the_issues_ratios():
    T = 4096
    cases = [BV.CASE[n] for n in ("causal", "window1024", "softcap30", "d256")]
    times = {("causal", "flash2_mma"): fake([1.0, 1.0, 1.0]), ("causal", "flex"): fake([1.5, 1.5, 1.5]),
             ("causal", "sdpa_cudnn"): fake([0.9, 0.9, 0.9]),
             ("window1024", "flash2_mma"): fake([0.5, 0.5, 0.5]), ("window1024", "flex"): fake([0.8, 0.8, 0.8]),
             ("softcap30", "flash2_mma"): fake([1.2, 1.2, 1.2]), ("softcap30", "flex"): fake([3.0, 3.0, 3.0])}
    notes = {("d256", "hopper_attn"): "not supported: head dimension 256 > 128"}
    rows = BV.rows_from_timings(T, cases, times, notes, {})
    assert len(rows) == len(cases) * len(BV.IMPLS)
    r = {(x["case"], x["impl"]): x for x in rows}
    c = r["causal", "flash2_mma"]
    assert c["vs flex"] == pytest.approx(1.5) and c["vs cuDNN"] == pytest.approx(0.9)
    assert c["TFLOP/s"] == pytest.approx(4 * 4 * 32 * 128 * T * (T + 1) / 2 / 1e-3 / 1e12)
    assert r["softcap30", "flash2_mma"]["vs causal"] == pytest.approx(1.2)
    assert r["softcap30", "flex"]["vs causal"] == pytest.approx(2.0)
    frac = BV.visible_pairs(BV.CASE["window1024"], T) / BV.visible_pairs(BV.CASE["causal"], T)
    assert r["window1024", "flash2_mma"]["vs causal x area"] == pytest.approx(0.5 / frac)
    assert r["d256", "hopper_attn"]["note"].startswith("not supported") and "ms" not in r["d256", "hopper_attn"]
    assert r["causal", "flex"]["vs flex"] is None and r["causal", "hopper_attn"]["note"] == "not run"
    assert "GPU: x" in BV.summary({"gpu": "x", "torch": "t", "dtype": "float16", "rows": rows})


def test_the_cli_lists_the_cases():
    with pytest.raises(SystemExit):
        BV.main(["--cases", "nope"])


def test_the_backward_pass_counts_its_flops_and_picks_the_backward_kernel():
    """--pass fwd+bwd: the forward's FLOPs times 3.5 in TFLOP/s, rows marked "fwd+bwd"; the Hopper backward for
    every case at d = 64 and 128 (soft-capping too), flash2_mma_bwd (its variant kernel) for d = 256."""
    from kernels.flash import flash2_mma_bwd
    from kernels.hopper import hopper_attn_bwd

    T, causal = 4096, BV.CASE["causal"]
    assert BV.flops(causal, T, backward=True) == pytest.approx(3.5 * BV.flops(causal, T))
    rows = BV.rows_from_timings(T, [causal], {("causal", "flash2_mma"): fake([2.0, 2.0, 2.0])}, {}, {},
                                backward=True)
    r = {x["impl"]: x for x in rows}["flash2_mma"]
    assert r["pass"] == "fwd+bwd" and r["TFLOP/s"] == pytest.approx(BV.flops(causal, T, backward=True) / 2e-3 / 1e12)
    for name in ("causal", "gqa8", "window1024", "alibi", "docs8", "softcap30"):
        assert BV.our_backward("hopper_attn", BV.CASE[name]) is hopper_attn_bwd.backward, name
    assert BV.our_backward("hopper_attn", BV.CASE["d256"]) is flash2_mma_bwd.backward
    assert BV.our_backward("flash2_mma", causal) is flash2_mma_bwd.backward
