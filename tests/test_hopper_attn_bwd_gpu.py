"""kernels/hopper/hopper_attn_bwd.py on a Hopper GPU: dq, dk, dv against the float64 reference (reference/backward.py).

The forward is hopper_attn.forward (its o and lse are what this backward is built for). The cases cover what the
kernel's parts change: one query and one key tile; ragged Tq and Tk (TMA zero-fill, masked P, guarded stores);
Tq < Tk and Tq > Tk under the causal mask (key tiles that skip leading query tiles; rows that see no key, which must
get exactly zero dq); many query tiles (the Q/dO ring wraps, the mbarrier phases flip); many key tiles (the dQ
reductions of several CTAs meet); a larger magnitude (std 10 logits); custom and negative scales; d 64 and 128
(different BLOCK_M and dQ splits); float16 and bfloat16. Tolerances are kernels.check's (the dtype's row of
CONTRIBUTING.md's table), as for the mma.sync backward in tests/test_torch_ops_gpu.py. Outputs start as NaN
(poisoned allocations), so an element the kernels do not write fails. The deterministic build gives the same dq bit
for bit over three runs. Every mix of the schedule switches (EARLY_P, EARLY_KV, DQ_FIRST: the same products, only
the waits moved) matches the reference on causal, ring-wrapping and many-key-tile cases, in the bulk, deterministic
and atomics builds, and gives the default schedule's gradients bit for bit (dk, dv always, dq in the deterministic
build). Grouped-query heads (k, v with fewer heads), windows and ALiBi against reference.variants. Needs compute
capability 9.x; skipped elsewhere with the reason.
"""

import functools
import itertools

import numpy as np
import pytest

import kernels
import reference as R
from kernels.hopper import hopper_attn as A
from kernels.hopper import hopper_attn_bwd as B

# (B, H, Tq, Tk, d, causal, dtype, magnitude, scale): what each case exercises
CASES = [
    (1, 1, 128, 128, 64, False, "float16", 1.0, None),     # one query tile, one key tile, no mask
    (1, 2, 64, 128, 128, False, "bfloat16", 1.0, None),    # the same at d = 128 (BLOCK_M = 64)
    (2, 2, 200, 333, 128, True, "float16", 1.0, None),     # ragged, Tq < Tk, causal (diagonal tiles)
    (1, 2, 300, 100, 64, True, "bfloat16", 1.0, None),     # Tq > Tk, causal: 200 rows see no key
    (1, 2, 300, 130, 128, True, "float16", 1.0, None),     # the same at d = 128, a ragged second key tile
    (1, 2, 77, 513, 128, False, "bfloat16", 1.0, None),    # five key tiles, the last with one key
    (1, 1, 257, 190, 64, False, "float16", 10.0, None),    # std 10: large logits
    (1, 2, 150, 150, 128, True, "float16", 1.0, 0.3),      # a custom scale
    (1, 1, 130, 260, 64, False, "float16", 1.0, -0.1),     # a negative scale
    (1, 2, 1, 300, 128, True, "bfloat16", 1.0, None),      # Tq = 1: the one query sees every key
    (2, 3, 700, 650, 64, True, "bfloat16", 1.0, None),     # six query tiles: the 2-slot ring wraps three times
    (1, 2, 520, 1100, 128, False, "float16", 1.0, None),   # nine query and nine key tiles: dQ from nine CTAs
]


def _no_key_rows(Tq, Tk, causal):
    return max(Tq - Tk, 0) if causal else 0


def _problem(cp, Bn, H, Tq, Tk, d, dtype, mag, seed=0):
    q, k, v = R.make_qkv(Bn, H, Tq, d, Tk, magnitude=mag, seed=seed, dtype=dtype)
    do = np.random.default_rng(seed + 1).standard_normal((Bn, H, Tq, d)).astype(dtype)
    dev = [cp.asarray(x) for x in (q, k, v, do)]
    host = [x.astype(np.float64) for x in (q, k, v, do)]  # exactly the values the GPU sees
    return dev, host


def _case_problem(cp, case):
    Bn, H, Tq, Tk, d, causal, dtype, mag, scale = case
    return _problem(cp, Bn, H, Tq, Tk, d, dtype, mag, seed=Tq + Tk + d)


@functools.lru_cache(maxsize=None)
def _reference(case):
    """The float64 dq, dk, dv of a case's inputs (the same values every time: the seed is the case's). Computed once
    per case: every build and schedule of a case compares with it (CASES[2] and CASES[10] over thirty times each)."""
    _, host = _case_problem(np, case)  # NumPy in place of CuPy: only the host arrays are used
    refs = R.attention_backward(*host, causal=case[5], scale=case[8])
    for ref in refs:
        ref.setflags(write=False)  # shared by the cases: no check may change it
    return refs


@pytest.fixture(scope="module", autouse=True)
def _drop_cached_references():
    yield
    _reference.cache_clear()


def _check(cp, case, deterministic=False):
    Bn, H, Tq, Tk, d, causal, dtype, mag, scale = case
    (q, k, v, do), _ = _case_problem(cp, case)
    o, lse = A.forward(q, k, v, causal=causal, scale=scale, return_lse=True)
    grads = B.backward(q, k, v, o, lse, do, causal=causal, scale=scale, deterministic=deterministic)
    refs = _reference(case)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    blind = _no_key_rows(Tq, Tk, causal)
    if blind:
        assert not cp.any(grads[0][:, :, :blind].view(cp.int16)), "rows that see no key must get exactly zero dq"
    return grads


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_backward_matches_reference(hopper, poison, case):
    _check(hopper, case)


@pytest.mark.parametrize("case", [CASES[2], CASES[3], CASES[11]], ids=lambda c: "-".join(map(str, c)))
def test_deterministic_build_matches_reference_bit_for_bit(hopper, poison, case):
    cp = hopper
    first = _check(cp, case, deterministic=True)
    for _ in range(2):
        again = _check(cp, case, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a.view(cp.int16) == b.view(cp.int16)).all()), f"{name} differs between deterministic runs"


@pytest.mark.parametrize("case", [CASES[2], CASES[4], CASES[10], CASES[11]], ids=lambda c: "-".join(map(str, c)))
def test_atomic_build_matches_reference(hopper, poison, monkeypatch, case):
    """The build that adds dQ by float4 atomics (-D DQ_BULK=0, the bulk reduce-add's predecessor that the notes
    page measures against it): the same gradients, in the same fragment-order accumulator."""
    monkeypatch.setattr(B, "DQ_BULK", 0)
    _check(hopper, case)
    _check(hopper, case, deterministic=True)


SCHEDULES = [dict(zip(B.SCHEDULE_SWITCHES, mix)) for mix in itertools.product((0, 1), repeat=len(B.SCHEDULE_SWITCHES))
             if any(mix)]
# causal at d = 128; rows that see no key; the ring wrapping three times; nine key tiles adding into dQ
SCHEDULE_CASES = [CASES[2], CASES[3], CASES[10], CASES[11]]


def _schedule_id(schedule):
    return "+".join(name.lower() for name, on in schedule.items() if on)


def _set_schedule(monkeypatch, schedule):
    for name, value in schedule.items():
        monkeypatch.setattr(B, name, value)
    assert B.schedule() == schedule


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
def test_schedule_builds_match_reference(hopper, poison, monkeypatch, schedule, case):
    """Each schedule's build (launcher constants set as kernels.bench.torch_ops --bwd-schedules sets them), in the
    bulk and the deterministic build: the float64 reference's gradients."""
    _set_schedule(monkeypatch, schedule)
    _check(hopper, case)
    _check(hopper, case, deterministic=True)


@pytest.mark.parametrize("case", [CASES[2], CASES[10]], ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
def test_schedule_atomic_builds_match_reference(hopper, poison, monkeypatch, schedule, case):
    """The same with dQ added by atomics (-D DQ_BULK=0): under DQ_FIRST they run while dK, dV still do."""
    _set_schedule(monkeypatch, schedule)
    monkeypatch.setattr(B, "DQ_BULK", 0)
    _check(hopper, case)
    _check(hopper, case, deterministic=True)


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=_schedule_id)
def test_schedule_builds_give_the_default_bits(hopper, poison, monkeypatch, schedule, case):
    """A schedule moves waits, not arithmetic: the same wgmmas on the same operands, P^T and dS^T by the same
    operations. So dk and dv equal the default build's bit for bit, and so does dq where its key-tile parts are added
    in a fixed order (deterministic); the default's dq order varies from run to run otherwise."""
    cp = hopper
    Bn, H, Tq, Tk, d, causal, dtype, mag, scale = case
    (q, k, v, do), _ = _problem(cp, Bn, H, Tq, Tk, d, dtype, mag, seed=Tq + Tk + d)
    o, lse = A.forward(q, k, v, causal=causal, scale=scale, return_lse=True)

    def run(deterministic):
        return B.backward(q, k, v, o, lse, do, causal=causal, scale=scale, deterministic=deterministic)

    default = {det: run(det) for det in (False, True)}
    _set_schedule(monkeypatch, schedule)
    for det in (False, True):
        for name, a, b in zip(("dq", "dk", "dv"), run(det), default[det]):
            if name != "dq" or det:
                assert bool((a.view(cp.int16) == b.view(cp.int16)).all()), \
                    f"{name} (deterministic={det}) differs from the default schedule's"


def test_lse_gradient_shifts_delta(hopper, poison):
    """dlse (the gradient of the lse output) adds P * dlse to dS, i.e. delta becomes delta - dlse."""
    cp = hopper
    (q, k, v, do), (q64, k64, v64, do64) = _problem(cp, 1, 2, 150, 190, 64, "float16", 1.0)
    dlse64 = np.random.default_rng(7).standard_normal((1, 2, 150))
    o, lse = A.forward(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = B.backward(q, k, v, o, lse, do, causal=True, dlse=cp.asarray(dlse64.astype(np.float32)))
    rq, rk, rv = R.attention_backward(q64, k64, v64, do64, causal=True, dlse=dlse64)
    for name, out, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        res = kernels.check(out, ref, "float16")
        assert res.ok, f"{name}: {res.detail()}"


# (B, Hq, Hkv, Tq, Tk, d, causal, dtype): grouped-query heads, the group sizes 2, 4 and 8 at both head sizes
GROUPED = [
    (1, 4, 2, 200, 333, 128, True, "float16"),    # ragged, causal, two kv heads of two query heads each
    (2, 8, 2, 300, 260, 64, False, "bfloat16"),   # four query heads a kv head, two batch entries
    (1, 8, 1, 130, 513, 64, True, "float16"),     # one kv head for eight query heads (multi-query), five key tiles
]


@pytest.mark.parametrize("case", GROUPED, ids=lambda c: "-".join(map(str, c)))
def test_grouped_heads_match_reference(hopper, poison, case):
    """k, v with fewer heads than q: dk and dv (k's shape) are the sums over each kv head's query heads, against
    reference.variants.attention_variant_backward; o and lse from the forward's grouped-query entry point."""
    from reference.variants import attention_variant_backward

    cp = hopper
    Bn, Hq, Hkv, Tq, Tk, d, causal, dtype = case
    rng = np.random.default_rng(Tq + Tk)
    host = [rng.standard_normal(shape).astype(dtype) for shape in
            ((Bn, Hq, Tq, d), (Bn, Hkv, Tk, d), (Bn, Hkv, Tk, d), (Bn, Hq, Tq, d))]
    q, k, v, do = (cp.asarray(x) for x in host)
    o, lse = A.forward(q, k, v, causal=causal, return_lse=True)
    grads = B.backward(q, k, v, o, lse, do, causal=causal)
    refs = attention_variant_backward(*(x.astype(np.float64) for x in host[:3]), host[3].astype(np.float64),
                                      causal=causal)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert out.shape == ref.shape, f"{name} has shape {out.shape}; the reference {ref.shape}"
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"


# (B, H, Hkv, Tq, Tk, d, causal, window, dtype, deterministic): the band (reference.variants' window)
WINDOWS = [
    (1, 2, 2, 300, 400, 64, True, (100, 0), "float16", False),      # causal window: both edges of the band
    (1, 2, 2, 520, 520, 128, True, (130, None), "bfloat16", False),  # query tiles before the band never visit
    (1, 2, 2, 200, 333, 128, False, (50, 70), "float16", False),    # a band on both sides, not causal
    (1, 1, 1, 300, 100, 64, True, (20, 0), "float16", False),       # Tq > Tk: 200 rows see no key
    (1, 2, 2, 700, 650, 64, False, (None, 40), "bfloat16", True),   # right side only: deterministic allowed
    (1, 4, 2, 260, 390, 64, True, (64, 0), "float16", False),       # with grouped-query heads
]


@pytest.mark.parametrize("case", WINDOWS, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_window_matches_reference(hopper, poison, case):
    """window=(left, right): the band of the forward's variant entry points, against
    reference.variants.attention_variant_backward; key tiles that no query sees write dk = dv = 0."""
    from reference.variants import attention_variant_backward

    cp = hopper
    Bn, Hq, Hkv, Tq, Tk, d, causal, window, dtype, deterministic = case
    rng = np.random.default_rng(Tq + Tk + d)
    host = [rng.standard_normal(shape).astype(dtype) for shape in
            ((Bn, Hq, Tq, d), (Bn, Hkv, Tk, d), (Bn, Hkv, Tk, d), (Bn, Hq, Tq, d))]
    q, k, v, do = (cp.asarray(x) for x in host)
    o, lse = A.forward(q, k, v, causal=causal, window=window, return_lse=True)
    grads = B.backward(q, k, v, o, lse, do, causal=causal, window=window, deterministic=deterministic)
    refs = attention_variant_backward(*(x.astype(np.float64) for x in host), causal=causal, window=window)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"


# (B, Hq, Hkv, Tq, Tk, d, causal, window, dtype): ALiBi (the -D ALIBI=1 build), alone and with the other variants
ALIBI = [
    (1, 4, 4, 300, 400, 64, True, None, "float16"),       # causal
    (1, 2, 2, 200, 333, 128, False, None, "bfloat16"),    # not causal: the bias on both sides of the diagonal
    (1, 4, 2, 260, 390, 128, True, (64, 0), "float16"),   # with a window and grouped-query heads
]


@pytest.mark.parametrize("case", ALIBI, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_alibi_matches_reference(hopper, poison, case):
    """alibi_slopes (one per query head): - slope |j - c| in each score, against
    reference.variants.attention_variant_backward, with o and lse from the forward's ALiBi entry point."""
    from reference.variants import attention_variant_backward

    cp = hopper
    Bn, Hq, Hkv, Tq, Tk, d, causal, window, dtype = case
    rng = np.random.default_rng(Tq + Tk + d + 1)
    host = [rng.standard_normal(shape).astype(dtype) for shape in
            ((Bn, Hq, Tq, d), (Bn, Hkv, Tk, d), (Bn, Hkv, Tk, d), (Bn, Hq, Tq, d))]
    slopes = (2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)).astype(np.float32)
    q, k, v, do = (cp.asarray(x) for x in host)
    opts = dict(causal=causal, window=window, alibi_slopes=cp.asarray(slopes))
    o, lse = A.forward(q, k, v, return_lse=True, **opts)
    grads = B.backward(q, k, v, o, lse, do, **opts)
    refs = attention_variant_backward(*(x.astype(np.float64) for x in host), causal=causal, window=window,
                                      alibi_slopes=slopes.astype(np.float64))
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"


# (B, Hq, Hkv, Tq, Tk, d, causal, window, dtype, lengths_q, lengths_k): document masking (the -D DOCS=1 build);
# lengths: the documents' lengths in order, or (id, length) pairs where an id recurs (lengths_k None: the keys' ids are
# the queries')
DOCS = [
    (2, 2, 2, 300, 300, 64, True, None, "float16", (1, 100, 7, 192), None),    # a document of one token
    (1, 2, 2, 500, 500, 128, False, None, "bfloat16", (130, 130, 240), None),  # not causal: tiles on both sides
    (1, 4, 2, 260, 390, 128, True, (64, 0), "float16", (60, 200), (90, 300)),  # Tq != Tk, window, grouped heads
    (1, 2, 2, 200, 333, 64, False, None, "float16", (200,), (100, 233)),       # key tiles no query sees: dk = dv = 0
    # document 0 recurs: key tiles 0 and 5 skip the EMPTY query tiles 1 .. 4 between their two runs
    (1, 2, 2, 768, 768, 64, False, None, "float16", ((0, 128), (1, 512), (0, 128)), None),
]


def _doc_ids(Bn, lengths):
    pairs = [n if isinstance(n, tuple) else (i, n) for i, n in enumerate(lengths)]
    ids = np.concatenate([np.full(n, i, dtype=np.int32) for i, n in pairs])
    return np.ascontiguousarray(np.broadcast_to(ids, (Bn, len(ids))))


@pytest.mark.parametrize("case", DOCS, ids=lambda c: "-".join(map(str, c[:9])).replace(" ", ""))
def test_docs_match_reference(hopper, poison, case):
    """doc_ids_q, doc_ids_k: a query sees only keys of its own document; the key tiles skip the query tiles of other
    documents (flash2_mma's classes at this kernel's tiles), against reference.variants.attention_variant_backward."""
    from reference.variants import attention_variant_backward

    cp = hopper
    Bn, Hq, Hkv, Tq, Tk, d, causal, window, dtype, lengths_q, lengths_k = case
    rng = np.random.default_rng(Tq + Tk + d + 2)
    host = [rng.standard_normal(shape).astype(dtype) for shape in
            ((Bn, Hq, Tq, d), (Bn, Hkv, Tk, d), (Bn, Hkv, Tk, d), (Bn, Hq, Tq, d))]
    ids_q = _doc_ids(Bn, lengths_q)
    ids_k = None if lengths_k is None else _doc_ids(Bn, lengths_k)
    q, k, v, do = (cp.asarray(x) for x in host)
    opts = dict(causal=causal, window=window, doc_ids_q=cp.asarray(ids_q),
                doc_ids_k=None if ids_k is None else cp.asarray(ids_k))
    o, lse = A.forward(q, k, v, return_lse=True, **opts)
    grads = B.backward(q, k, v, o, lse, do, **opts)
    refs = attention_variant_backward(*(x.astype(np.float64) for x in host), causal=causal, window=window,
                                      doc_ids_q=ids_q, doc_ids_k=ids_k)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"


# (B, Hq, Hkv, Tq, Tk, d, dtype, std, options): tanh soft-capping (the -D SOFTCAP=1 build), alone and with the others
SOFTCAP = [
    (1, 4, 4, 300, 400, 64, "float16", 1.0, dict(causal=True, softcap=30.0)),
    (1, 2, 2, 200, 333, 128, "bfloat16", 1.0, dict(softcap=20.0)),                         # not causal, Tq < Tk
    (1, 4, 2, 260, 390, 128, "float16", 1.0, dict(causal=True, window=(64, 0), softcap=30.0, alibi=True)),  # Gemma 2
    (2, 2, 2, 300, 300, 64, "float16", 10.0, dict(causal=True, softcap=5.0, docs=(1, 100, 199))),  # tanh near +-1
    (1, 2, 2, 520, 300, 128, "bfloat16", 1.0, dict(causal=True, softcap=50.0, deterministic=True)),  # Tq > Tk
]
# prefix-LM (the -D PREFIX=1 build): the first prefix keys seen by every query besides the band
PREFIX = [
    (1, 2, 2, 300, 300, 64, "float16", 1.0, dict(causal=True, prefix=100)),  # the prefix ends inside a key tile
    (1, 4, 2, 260, 390, 128, "bfloat16", 1.0, dict(causal=True, window=(64, 0), prefix=130)),  # a gap before the band
    (1, 2, 2, 520, 300, 128, "float16", 1.0, dict(causal=True, prefix=200, deterministic=True)),
    (2, 2, 2, 300, 300, 64, "float16", 1.0, dict(causal=True, prefix=50, softcap=30.0, docs=(120, 1, 179))),
]


@pytest.mark.parametrize("case", SOFTCAP + PREFIX, ids=lambda c: "-".join(map(str, c[:8])) + "-" + "-".join(c[8]))
def test_softcap_and_prefix_match_reference(hopper, poison, case):
    """softcap: the scores softcap tanh(s / softcap) before ALiBi and the mask, as the forward computes them; dS gets
    the cap's derivative 1 - tanh^2. prefix: keys j < prefix are seen by every query, so their key tiles meet every
    query tile. Against reference.variants.attention_variant_backward, with o and lse from the forward's variant entry
    point; the deterministic build gives dq bit for bit again."""
    from reference.variants import attention_variant_backward

    cp = hopper
    Bn, Hq, Hkv, Tq, Tk, d, dtype, std, options = case
    options = dict(options)
    deterministic = options.pop("deterministic", False)
    rng = np.random.default_rng(Tq + Tk + d + 3)
    host = [(std * rng.standard_normal(shape)).astype(dtype) for shape in
            ((Bn, Hq, Tq, d), (Bn, Hkv, Tk, d), (Bn, Hkv, Tk, d), (Bn, Hq, Tq, d))]
    ref_opts = {key: options[key] for key in ("causal", "window", "softcap", "prefix") if key in options}
    if options.get("alibi"):
        ref_opts["alibi_slopes"] = (2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)).astype(np.float32)
    if "docs" in options:
        ref_opts["doc_ids_q"] = _doc_ids(Bn, options["docs"])
    gpu_opts = {key: cp.asarray(x) if isinstance(x, np.ndarray) else x for key, x in ref_opts.items()}
    q, k, v, do = (cp.asarray(x) for x in host)
    o, lse = A.forward(q, k, v, return_lse=True, **gpu_opts)
    grads = B.backward(q, k, v, o, lse, do, deterministic=deterministic, **gpu_opts)
    refs = attention_variant_backward(*(x.astype(np.float64) for x in host), **ref_opts)
    for name, out, ref in zip(("dq", "dk", "dv"), grads, refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    if deterministic:
        again = B.backward(q, k, v, o, lse, do, deterministic=True, **gpu_opts)
        for name, a, b in zip(("dq", "dk", "dv"), grads, again):
            assert bool((a.view(cp.int16) == b.view(cp.int16)).all()), f"{name} differs between deterministic runs"


def test_errors(hopper):
    cp = hopper
    (q, k, v, do), _ = _problem(cp, 1, 1, 64, 64, 64, "float16", 1.0)
    o, lse = A.forward(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        B.backward(q, k, v, o, lse[:, :, :4].copy(), do)
    with pytest.raises(TypeError, match="do"):
        B.backward(q, k, v, o, lse, do.astype(cp.float32))
    with pytest.raises(TypeError, match="lse"):
        B.backward(q, k, v, o, lse.astype(cp.float16), do)
    with pytest.raises(ValueError, match="o has shape"):
        B.backward(q, k, v, o[:, :, :32].copy(), lse, do)
    x = cp.zeros((1, 1, 64, 96), cp.float16)
    with pytest.raises(ValueError, match=r"d=96 .*\(64, 128\)"):
        B.backward(x, x, x, x, lse, x)
    with pytest.raises(ValueError, match="scale"):
        B.backward(q, k, v, o, lse, do, scale=float("inf"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        flat = cp.empty(q.size + 1, dtype=cp.float16)
        B.backward(q, k, v, flat[1:].reshape(q.shape), lse, do)
    q3 = cp.zeros((1, 3, 64, 64), cp.float16)
    k2 = cp.zeros((1, 2, 64, 64), cp.float16)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        B.backward(q3, k2, k2, q3, cp.zeros((1, 3, 64), cp.float32), q3)
    with pytest.raises(ValueError, match="deterministic"):
        B.backward(q, k, v, o, lse, do, causal=True, window=(16, 0), deterministic=True)
    with pytest.raises(ValueError, match="window"):
        B.backward(q, k, v, o, lse, do, window=(-1, 0))
    with pytest.raises(ValueError, match="alibi_slopes"):
        B.backward(q, k, v, o, lse, do, alibi_slopes=cp.zeros(3, cp.float32))
    ids = cp.zeros((1, 64), cp.int32)
    with pytest.raises(ValueError, match="deterministic"):
        B.backward(q, k, v, o, lse, do, doc_ids_q=ids, deterministic=True)
    with pytest.raises(ValueError, match="doc_ids_q"):
        B.backward(q, k, v, o, lse, do, doc_ids_q=cp.zeros((1, 63), cp.int32))
    with pytest.raises(ValueError, match="same shape"):
        B.backward(q3, k2[:, :1].copy(), k2, q3, cp.zeros((1, 3, 64), cp.float32), q3)
    with pytest.raises(ValueError, match="softcap"):
        B.backward(q, k, v, o, lse, do, softcap=0.0)
    with pytest.raises(TypeError, match="softcap"):
        B.backward(q, k, v, o, lse, do, softcap="30")
    with pytest.raises(ValueError, match="prefix"):
        B.backward(q, k, v, o, lse, do, prefix=65)


def test_below_hopper_raises_naming_the_capability(gpu, monkeypatch):
    """On a GPU older than a Hopper (here faked: an Ampere's 8.0), UnsupportedDeviceError names compute capability
    9.0, before anything is compiled or launched."""
    import dataclasses

    from kernels import core

    cp = gpu
    dev = cp.cuda.runtime.getDevice()
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), cc=(8, 0)))
    core.clear_launch_caches()
    x = cp.zeros((1, 1, 64, 64), cp.float16)
    lse = cp.zeros((1, 1, 64), cp.float32)
    try:
        with pytest.raises(kernels.UnsupportedDeviceError, match=r"9\.0"):
            B.backward(x, x, x, x, lse, x)
    finally:
        monkeypatch.undo()
        core.clear_launch_caches()
