"""The one timing helper of the course: kernel time and call time, measured the same way for every kernel and peer.

    t = benchmark(lambda: forward(q, k, v))
    t.ms, t.min_ms, t.max_ms   kernel time: median and spread of the GPU time per call (what ratios use)
    t.call_ms                  call time: what one Python call costs, host overhead included
    t.flushed_ms               kernel time with a cold L2 (only with flush_l2=True)
    t.tflops(flops), t.gbps(nbytes)      from the kernel time
    compare({"ours": f, "peer": g})    several callables side by side, in rounds; paired_ratio(t_f, t_g) from them
    sustained(fn)              the kernel time once the GPU has run fn for seconds, with its clock and power then
    host_overhead_us(fn)       the host's own cost of one call: Python, argument checks, allocation, launch
    copy_bandwidth_gbps(), read_bandwidth_gbps()   the memory ceilings memory-bound kernels are measured against
    read_call(nbytes)          a pure read of nbytes, to time beside a memory-bound kernel of that size

Two numbers, because they answer two questions:

kernel time  How fast is the kernel? The GPU time of the work one call launches, with Python out of the
             picture. A `hold_gpu` kernel (kernels/core/timing.cu) keeps the GPU busy while the host queues `batch`
             calls behind it; an event pair around the queued calls then sees the GPU run them back to back,
             never waiting for Python. The figure is the batch time / batch, median over `batches` batches,
             with the slowest and fastest batch as the spread. The inputs stay in L2 from one call to the next
             (warm L2) wherever they fit in it (50 MB on an H100).
call time    What does a user's single call cost? A pair of events around one call on an idle GPU: the host's
             work (argument checks, allocations, launches) counts, because the GPU waits for it. Median of
             `calls` calls. For a kernel of a few microseconds (decoding, small batches) this is the number
             that matters; for a long kernel the two agree.

If a call waits for the GPU itself (it reads a result back, for example), the host cannot queue the batch
while the GPU holds, the batch includes host time, and Timing.host_bound says so.

Ratios between kernels. A GPU's clock is not constant: it starts a run cool, at its top clock, and a long run of
tensor-core work reaches the board's power limit (700 W on an H100 SXM), where the clock falls to whatever keeps the
power there (1.4-1.75 GHz in notebook 06's measurement, against 1.98 GHz). On an H100 the same kernel, timed four
times in one run, took up to 9% longer in its later rounds than in its first: a kernel timed at the start of a run and
its peer timed a minute later differ by that much for no reason of their own. compare() times the kernels of one
comparison in rounds (each round times every kernel once, the order turned by one place per round, so none always
runs first or always right after the same neighbour), and paired_ratio() takes the median, over the rounds, of the
two kernels' ratio within a round. sustained() answers the other question, what a long job sees: the time per call
after seconds of nothing but that kernel, with the clock and power it ran at.

Also: the FLOP and byte counts of attention, and a small table printer that notebooks and the command line share.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .device import ceil_div, cp, current_device, device_info
from .launch import get_kernel

KERNEL_FILE = "timing.cu"
FLUSH_BLOCK = 256
FLUSH_MAX_GRID = 65536
MIN_HOLD_NS = 100_000  # 0.1 ms
MAX_HOLD_NS = 500_000_000  # 0.5 s


@dataclass(frozen=True)
class Timing:
    """The measurements of one callable. All times in milliseconds per call."""
    ms: float  # kernel time, median over batches
    min_ms: float
    max_ms: float
    call_ms: float  # call time, median over single calls
    call_min_ms: float
    call_max_ms: float
    flushed_ms: float | None = None  # kernel time after an L2 flush, median over single calls
    flushed_min_ms: float | None = None
    flushed_max_ms: float | None = None
    host_bound: bool = False  # True when the batches could not be queued ahead of the GPU
    batch: int = 0
    batches: int = 0
    calls: int = 0
    samples: list = field(repr=False, default_factory=list)  # kernel ms of each batch
    rounds: list = field(repr=False, default_factory=list)  # compare(): kernel ms of each round, in round order

    def tflops(self, flops: float, which: str = "kernel") -> float:
        return flops / (self._ms(which) * 1e-3) / 1e12

    def gbps(self, nbytes: float, which: str = "kernel") -> float:
        return nbytes / (self._ms(which) * 1e-3) / 1e9

    def _ms(self, which: str) -> float:
        ms = {"kernel": self.ms, "call": self.call_ms, "flushed": self.flushed_ms}[which]
        if ms is None:
            raise ValueError("no L2-flushed time was measured (benchmark(..., flush_l2=True))")
        return ms

    def columns(self, unit: str = "ms") -> dict:
        """The table columns every notebook shows: kernel time with its spread, and call time."""
        f = 1e3 if unit == "us" else 1.0
        cols = {f"kernel {unit}": self.ms * f, "spread %": 100 * (self.max_ms - self.min_ms) / self.ms,
                f"call {unit}": self.call_ms * f}
        if self.flushed_ms is not None:
            cols[f"cold-L2 {unit}"] = self.flushed_ms * f
        return cols

    def as_dict(self) -> dict:
        """Numbers only (for JSON)."""
        d = asdict(self)
        d.pop("samples")
        d.pop("rounds")
        return d


def hold_gpu(ns: int) -> None:
    """Queue a one-thread kernel that keeps the GPU busy for `ns` nanoseconds (kernels/core/timing.cu)."""
    get_kernel(KERNEL_FILE, "hold_gpu")((1,), (1,), (np.uint64(ns),))


_FLUSH_BUFFERS: dict = {}


def flush_l2_cache() -> None:
    """Overwrite a buffer twice the size of this GPU's L2 cache, so the next kernel starts with a cold L2."""
    dev = current_device()
    buf = _FLUSH_BUFFERS.get(dev)
    if buf is None:
        buf = _FLUSH_BUFFERS[dev] = cp.empty(max(2 * device_info(dev).l2_bytes, 1 << 26) // 4, dtype=cp.uint32)
    grid = min(ceil_div(buf.size, FLUSH_BLOCK), FLUSH_MAX_GRID)
    get_kernel(KERNEL_FILE, "flush_l2")((grid,), (FLUSH_BLOCK,), (buf, np.int64(buf.size), np.uint32(0)))


def _elapsed(start, end) -> float:
    return cp.cuda.get_elapsed_time(start, end)


BATCH_GPU_MS = 25.0  # a batch of the default size holds about this much GPU work (3 to 20 calls)


def benchmark(fn, *, batch: int | None = None, batches: int = 5, calls: int = 10, warmup: int = 3,
              flush_l2: bool = False) -> Timing:
    """Kernel time and call time of fn() (see the module docstring); flush_l2 adds a cold-L2 kernel time.

    batch: calls per kernel-time batch; by default about BATCH_GPU_MS of work, from 3 calls (long kernels) to 20.

    fn must launch its GPU work on CuPy's current stream (by default the legacy default stream, which is
    also torch's default): the events and the hold kernel go there.
    """
    if (batch is not None and batch < 1) or batches < 1 or calls < 1:
        raise ValueError(f"batch, batches and calls must be >= 1; got {batch}, {batches}, {calls}")
    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()

    # Call time: one call between two events on an idle GPU. The host's own time per call is noted too,
    # to size the hold of the kernel-time batches.
    call, host = [], []
    for _ in range(calls):
        stream.synchronize()
        start.record(stream)
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        end.record(stream)
        end.synchronize()
        call.append(_elapsed(start, end))
    host_ns = statistics.median(host) * 1e9
    if batch is None:
        batch = int(min(max(BATCH_GPU_MS / max(statistics.median(call), 1e-3), 3), 20))

    # Kernel time: batches of back-to-back calls queued behind a hold kernel. If queueing a batch took
    # nearly as long as the hold, the GPU may have waited for the host: hold longer and measure again
    # (twice at most), else report host_bound.
    kernel, host_bound = [], False
    hold_ns = int(min(max(4 * batch * host_ns + 50_000, MIN_HOLD_NS), MAX_HOLD_NS))
    for _ in range(batches):
        for attempt in range(3):
            stream.synchronize()
            t0 = time.perf_counter()  # before the hold's launch: a host stall there eats into the hold too
            hold_gpu(hold_ns)
            start.record(stream)
            for _ in range(batch):
                fn()
            queued_ns = (time.perf_counter() - t0) * 1e9
            end.record(stream)
            end.synchronize()
            waited = queued_ns >= 0.8 * hold_ns  # judged against the hold this batch ran behind
            if not waited or hold_ns >= MAX_HOLD_NS or attempt == 2:
                break
            hold_ns = min(4 * hold_ns, MAX_HOLD_NS)
        host_bound |= waited
        kernel.append(_elapsed(start, end) / batch)

    # Cold L2: each call alone, after a write of twice the L2 and a short hold (outside the events).
    flushed = []
    if flush_l2:
        short_hold = int(min(max(4 * host_ns + 20_000, 50_000), MAX_HOLD_NS))
        for _ in range(calls):
            stream.synchronize()
            flush_l2_cache()
            hold_gpu(short_hold)
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            flushed.append(_elapsed(start, end))

    return Timing(
        ms=statistics.median(kernel), min_ms=min(kernel), max_ms=max(kernel),
        call_ms=statistics.median(call), call_min_ms=min(call), call_max_ms=max(call),
        flushed_ms=statistics.median(flushed) if flushed else None,
        flushed_min_ms=min(flushed) if flushed else None, flushed_max_ms=max(flushed) if flushed else None,
        host_bound=host_bound, batch=batch, batches=batches, calls=calls, samples=kernel)


def compare(fns: dict, *, rounds: int = 3, **options) -> dict:
    """{name: Timing} for each zero-argument callable of `fns`, timed side by side (see "Ratios between kernels").

    Round r runs benchmark(fn, **options) once for every callable, starting r places further along the list, so
    that each callable runs first in some round and follows a different neighbour. The Timing returned for a callable
    is its median round (the round of median kernel time: its columns then come from one measurement), with
    `rounds` holding the kernel time of every round, in round order, for paired_ratio.
    """
    if rounds < 1 or not fns:
        raise ValueError(f"compare needs at least one callable and rounds >= 1; got {len(fns)} and {rounds}")
    names = list(fns)
    per_round = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            per_round[name].append(benchmark(fns[name], **options))
    out = {}
    for name in names:
        ts = per_round[name]
        median_round = sorted(ts, key=lambda t: t.ms)[(len(ts) - 1) // 2]
        out[name] = replace(median_round, rounds=[t.ms for t in ts])
    return out


def paired_ratio(t: Timing, peer: Timing, *, worst: bool = False) -> float:
    """peer's kernel time / t's within each round of one compare(), the median over the rounds (above 1: t is the
    faster); worst=True gives the lowest round's ratio instead. Both must come from the same compare() call."""
    if not t.rounds or len(t.rounds) != len(peer.rounds):
        raise ValueError("paired_ratio takes two Timings of the same compare() call (their .rounds pair up); got "
                         f"{len(t.rounds)} and {len(peer.rounds)} rounds")
    ratios = [p / x for x, p in zip(t.rounds, peer.rounds)]
    return min(ratios) if worst else statistics.median(ratios)


SMI_QUERY = "clocks.sm,power.draw,temperature.gpu,power.limit,clocks.max.sm"


def _smi_sample(bus_id: str):
    """(SM MHz, watts, degrees C, power limit W, top SM MHz) of the GPU at PCI bus `bus_id` from nvidia-smi, or None
    without it. (The bus id names the same GPU for CUDA and nvidia-smi, whose index orders can differ.)"""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-i", bus_id, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return tuple(float(x) for x in out.strip().split(","))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def sustained(fn, *, seconds: float = 3.0, batch_ms: float = 150.0) -> dict:
    """fn() run back to back for `seconds`, as a long job runs it: ms per call over the second half, and the SM clock,
    power draw and temperature that nvidia-smi reports meanwhile (medians over the second half; None where nvidia-smi
    is missing), with the board's power limit and the GPU's top SM clock.

    The calls go in batches of about batch_ms of GPU work; each sample is read while a batch is still queued, so the
    GPU never idles for the query. The first half is the ramp from a cool GPU to its steady state and is not counted.
    """
    stream = cp.cuda.get_current_stream()
    bus_id = cp.cuda.Device(current_device()).pci_bus_id
    fn()
    stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    per_batch = int(min(max(batch_ms / max(_elapsed(start, end), 1e-3), 1), 10_000))
    batches = []  # (elapsed ms, calls, sample)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start.record(stream)
        for _ in range(per_batch):
            fn()
        end.record(stream)
        sample = _smi_sample(bus_id)  # while the batch runs
        end.synchronize()
        batches.append((_elapsed(start, end), per_batch, sample))
    late = batches[len(batches) // 2:]
    samples = [b[2] for b in late if b[2] is not None]
    med = (lambda i: statistics.median(s[i] for s in samples)) if samples else (lambda i: None)  # noqa: E731
    return {"ms": sum(b[0] for b in late) / sum(b[1] for b in late), "calls": sum(b[1] for b in batches),
            "sm_mhz": med(0), "power_w": med(1), "temp_c": med(2), "power_limit_w": med(3), "sm_max_mhz": med(4)}


def host_overhead_us(fn, *, calls: int = 200, repeats: int = 5, warmup: int = 1000) -> float:
    """Microseconds of host time per call of fn(): the lowest of `repeats` medians of `calls` calls issued back to back.

    Use it on a tiny input, where each kernel takes a few microseconds: the GPU then finishes a call before the host
    has issued the next one, so no call waits for the GPU, and what is measured is Python, the launcher's checks,
    its allocations and the driver's launch. Whatever else the machine does can only add time to a run, so the best
    run is the figure (as timeit reports it); torch's own calls are measured the same way for comparison.
    The warm-up is long on purpose: the first few hundred calls of a new launch path are measurably slower (the
    interpreter's caches, CuPy's memory pool and the driver all settle), and a user's model makes millions.
    """
    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    medians = []
    for _ in range(repeats):
        per_call = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            per_call.append(time.perf_counter() - t0)
        stream.synchronize()
        medians.append(statistics.median(per_call))
    return min(medians) * 1e6


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of `nbytes` (bytes read + bytes written): the roofline's memory ceiling."""
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = benchmark(lambda: cp.copyto(dst, src), batch=10, batches=3, calls=3)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()  # give the 2 GiB back rather than leave it split into later arrays
    return t.gbps(2 * nbytes)


def read_call(nbytes: int):
    """A zero-argument callable that reads `nbytes` once (read_only in kernels/core/timing.cu, over a buffer of its own):
    a kernel that does nothing but stream those bytes in, to time beside a memory-bound kernel of the same size."""
    src = cp.ones(nbytes // 4, dtype=cp.uint32)
    grid = 4 * device_info().sm_count
    out = cp.empty(grid, dtype=cp.uint32)
    kern = get_kernel(KERNEL_FILE, "read_only")
    n4 = np.int64(nbytes // 16)
    return lambda: kern((grid,), (256,), (src, n4, out))


def read_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """GB/s of a kernel that only reads `nbytes` (read_call): the ceiling of a kernel that streams data in and writes
    almost nothing, such as decoding over a KV cache."""
    fn = read_call(nbytes)
    t = benchmark(fn, batch=10, batches=3, calls=3)
    del fn
    cp.get_default_memory_pool().free_all_blocks()
    return t.gbps(nbytes)


def fits_in_l2(nbytes: int) -> bool:
    """True when `nbytes` fit in this GPU's L2 cache: then a warm-L2 kernel time flatters, so flush too."""
    return nbytes <= device_info().l2_bytes


# The backward's FLOPs over the forward's: five matrix products of 2 Tq Tk d each against two (the convention
# FlashAttention's benchmarks use); forward + backward is 1 + this.
BACKWARD_FLOP_FACTOR = 2.5


def attention_flops(B: int, H: int, Tq: int, Tk: int, d: int, causal: bool = False) -> float:
    """4 * B * H * Tq * Tk * d (two matrix products of 2*Tq*Tk*d each), halved for causal."""
    flops = 4.0 * B * H * Tq * Tk * d
    return flops / 2 if causal else flops


def attention_bytes(B: int, H: int, Tq: int, Tk: int, d: int, itemsize: int) -> float:
    """The fewest bytes attention must move: read q, k, v once and write o once."""
    return float(itemsize) * B * H * d * (2 * Tq + 2 * Tk)


def format_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str = ".3g") -> str:
    """Plain-text table of dicts (one per row), columns in the given order."""
    if not rows:
        return "(no rows)"
    columns = columns or list(dict.fromkeys(c for r in rows for c in r))

    def fmt(x):
        if isinstance(x, float):
            return format(x, floatfmt)
        return str(x)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
