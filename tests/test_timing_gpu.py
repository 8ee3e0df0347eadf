"""kernels.core.timing on the GPU: what it measures must be consistent with what it timed (no time is asserted
against a target: only bounds that follow from the measurement's own definition)."""

import numpy as np
import pytest

import kernels
from kernels.core import timing


def test_kernel_time_is_at_least_what_the_kernel_waits(gpu):
    """hold_gpu(200 us) cannot take less than 200 us of GPU time, in either measure."""
    t = timing.benchmark(lambda: timing.hold_gpu(200_000), batch=5, batches=3, calls=3, flush_l2=True)
    assert t.min_ms >= 0.2 and t.call_min_ms >= 0.2 and t.flushed_min_ms >= 0.2
    assert t.min_ms <= t.ms <= t.max_ms and t.call_min_ms <= t.call_ms <= t.call_max_ms
    assert not t.host_bound
    d = t.as_dict()
    assert "samples" not in d and all(isinstance(d[k], (int, float)) for k in ("ms", "call_ms", "flushed_ms"))


def test_a_call_that_waits_for_the_gpu_is_reported_host_bound(gpu):
    cp = gpu
    x = cp.ones(1024, dtype=cp.float32)
    t = timing.benchmark(lambda: float(x.sum()), batch=3, batches=2, calls=3)  # float() reads back: a sync
    assert t.host_bound


def test_columns_and_rates(gpu):
    t = timing.benchmark(lambda: timing.hold_gpu(50_000), batch=3, batches=2, calls=2)
    cols = t.columns(unit="us")
    assert list(cols) == ["kernel us", "spread %", "call us"]
    assert cols["kernel us"] == pytest.approx(t.ms * 1e3)
    assert t.tflops(1e12) == pytest.approx(1.0 / (t.ms * 1e-3))
    with pytest.raises(ValueError, match="no L2-flushed time"):
        t.gbps(1.0, which="flushed")
    with pytest.raises(ValueError, match="must be >= 1"):
        timing.benchmark(lambda: None, batch=0)


def test_host_overhead_and_bandwidths_are_positive(gpu):
    cp = gpu
    q = cp.asarray(np.ones((1, 1, 16, 64), np.float16))
    us = kernels.host_overhead_us(lambda: kernels.REGISTRY["flash2_mma"].forward(q, q, q), calls=20)
    assert 0 < us < 1e5
    assert timing.read_bandwidth_gbps(1 << 26) > 0 and timing.copy_bandwidth_gbps(1 << 26) > 0


def test_flush_buffer_is_larger_than_l2(gpu):
    timing.flush_l2_cache()
    buf = timing._FLUSH_BUFFERS[kernels.device_info().id]
    assert buf.nbytes >= 2 * kernels.device_info().l2_bytes


@pytest.mark.parametrize("n4", [1, 1000, 8 * 132 * 4 * 256 + 12345])
def test_read_only_reads_every_word(gpu, n4):
    """read_only's XOR over its blocks' outputs is the XOR of all n4 16-byte words: its unrolled loop and the loop
    for the last words together touch each word exactly once (a word read twice would cancel out of the XOR)."""
    cp = gpu
    words = np.random.default_rng(n4).integers(0, 2**32, size=(n4, 4), dtype=np.uint32)
    src = cp.asarray(words)
    grid = 4 * kernels.device_info().sm_count
    out = cp.zeros(grid, dtype=cp.uint32)
    kernels.get_kernel(timing.KERNEL_FILE, "read_only")((grid,), (256,), (src, np.int64(n4), out))
    assert int(np.bitwise_xor.reduce(out.get())) == int(np.bitwise_xor.reduce(words.ravel()))


# ---- compare / paired_ratio: the bookkeeping on the CPU (benchmark replaced by a recorder), the bounds on the GPU ----

def _fake_benchmark(order, times):
    """A stand-in for timing.benchmark: records which callable ran, returns the next of its scripted kernel times."""
    def bench(fn, **options):
        name = fn()
        order.append(name)
        ms = times[name].pop(0)
        return timing.Timing(ms=ms, min_ms=ms, max_ms=ms, call_ms=ms, call_min_ms=ms, call_max_ms=ms)
    return bench


def test_compare_turns_the_order_each_round_and_pairs_the_rounds(monkeypatch):
    order = []
    times = {"a": [1.0, 3.0, 2.0, 9.0], "b": [2.0, 3.0, 8.0, 4.0], "c": [5.0, 5.0, 5.0, 5.0]}
    monkeypatch.setattr(timing, "benchmark", _fake_benchmark(order, times))
    res = timing.compare({n: (lambda n=n: n) for n in "abc"}, rounds=4)
    assert order == list("abc" "bca" "cab" "abc")  # each round starts one place further along
    assert list(res) == ["a", "b", "c"]
    assert res["a"].rounds == [1.0, 3.0, 2.0, 9.0] and res["b"].rounds == [2.0, 3.0, 8.0, 4.0]
    assert res["a"].ms == 2.0 and res["b"].ms == 3.0  # the median round (the lower middle one of an even count)
    # b's time / a's time within each round: 2, 1, 4, 4/9 -> median 1.5, worst 4/9
    assert timing.paired_ratio(res["a"], res["b"]) == pytest.approx(1.5)
    assert timing.paired_ratio(res["a"], res["b"], worst=True) == pytest.approx(4 / 9)
    assert "rounds" not in res["a"].as_dict()


def test_compare_and_paired_ratio_refuse_what_they_cannot_pair(monkeypatch):
    monkeypatch.setattr(timing, "benchmark", _fake_benchmark([], {"a": [1.0], "b": [1.0, 2.0]}))
    with pytest.raises(ValueError, match="rounds >= 1"):
        timing.compare({"a": lambda: "a"}, rounds=0)
    with pytest.raises(ValueError, match="at least one callable"):
        timing.compare({}, rounds=2)
    one = timing.compare({"a": lambda: "a"}, rounds=1)["a"]
    two = timing.compare({"b": lambda: "b"}, rounds=2)["b"]
    with pytest.raises(ValueError, match="same compare"):
        timing.paired_ratio(one, two)
    plain = timing.Timing(ms=1.0, min_ms=1.0, max_ms=1.0, call_ms=1.0, call_min_ms=1.0, call_max_ms=1.0)
    with pytest.raises(ValueError, match="same compare"):
        timing.paired_ratio(plain, plain)


def test_compare_and_sustained_on_the_gpu(gpu):
    """Every round of a 100 us and a 300 us hold lasts at least the hold; sustained time is at least the hold too."""
    res = timing.compare({"short": lambda: timing.hold_gpu(100_000), "long": lambda: timing.hold_gpu(300_000)},
                         rounds=2, batch=3, batches=2, calls=2)
    assert min(res["short"].rounds) >= 0.1 and min(res["long"].rounds) >= 0.3
    assert res["short"].ms in res["short"].rounds
    # the ratios pair round r of one with round r of the other (the order compare() recorded them in)
    pairs = [b / a for a, b in zip(res["short"].rounds, res["long"].rounds)]
    assert timing.paired_ratio(res["short"], res["long"]) == pytest.approx(float(np.median(pairs)))
    assert timing.paired_ratio(res["short"], res["long"], worst=True) == pytest.approx(min(pairs))
    s = timing.sustained(lambda: timing.hold_gpu(1_000_000), seconds=0.5, batch_ms=50)
    assert s["ms"] >= 1.0 and s["calls"] >= 2
    assert set(s) == {"ms", "calls", "sm_mhz", "power_w", "temp_c", "power_limit_w", "sm_max_mhz"}


# ---- the benches of notebooks 09-12 take their ratios from the rounds of one compare(): bookkeeping on the CPU ----

def test_bench_sampling_times_a_shape_in_one_compare_and_pairs_the_speedup(monkeypatch):
    """Each of ours and each of torch's (the top-k peer once for its two rows) in the same rounds; the speedup is the
    median of the rounds' ratios (3, 1, 3 -> 3), not the ratio of the median rounds (3 / 2)."""
    from kernels.bench import sampling as BS

    names = [("ours", m) for m, _, _ in BS.PAIRS] + [("torch", t) for t in dict.fromkeys(p[2] for p in BS.PAIRS)]
    times = {n: [1.0, 2.0, 3.0] if n[0] == "ours" else [3.0, 2.0, 9.0] for n in names}
    order = []
    monkeypatch.setattr(timing, "benchmark", _fake_benchmark(order, times))
    monkeypatch.setattr(BS, "make_logits", lambda B, V: None)
    monkeypatch.setattr(BS, "ours", lambda x, cluster=None: {m: (lambda m=m: ("ours", m)) for m in BS.KWARGS})
    monkeypatch.setattr(BS, "torch_peers", lambda x: {m: (lambda t=t: ("torch", t)) for m, _, t in BS.PAIRS})
    monkeypatch.setattr(BS, "check_tokens", lambda x, method, cluster=None: True)
    monkeypatch.setattr(BS, "kernel_name", lambda B, V, method, cluster=None: "fake")
    rows = BS.measure(64, 1000, 1.0, log=lambda *a: None)
    assert len(order) == BS.ROUNDS * len(names) and not any(times.values())  # every callable once a round
    assert [r["method"] for r in rows] == [m for m, _, _ in BS.PAIRS]
    for r in rows:
        assert r["ours_rounds_us"] == [1e3, 2e3, 3e3] and r["torch_rounds_us"] == [3e3, 2e3, 9e3]
        assert r["ours_kernel_us"] == 2e3 and r["torch_kernel_us"] == 3e3  # the median rounds
        assert r["speedup"] == pytest.approx(3.0)


def test_bench_triton_table_shows_the_paired_ratio():
    """"vs flash" is the row's paired ratio from measure(), not SDPA flash's median round over the row's."""
    from kernels.bench import triton as BT

    shape = dict(B=4, H=32, T=4096, d=64, causal=False, direction="forward")
    rows = [dict(shape, name="flash2_triton", kernel_ms=2.0, call_ms=2.1, tflops=1.0, ratio_sdpa_flash=3.0),
            dict(shape, name="sdpa_flash", kernel_ms=3.0, call_ms=3.1, tflops=1.0, ratio_sdpa_flash=1.0),
            dict(shape, name="sdpa_cudnn", note="not run: RuntimeError: refused")]
    vs = [r["vs flash"] for r in BT.table(rows)]
    assert vs[:2] == [3.0, 1.0] and np.isnan(vs[2])
