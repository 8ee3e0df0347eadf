"""The one timing helper of the course: CUDA events around the launch, warm-up first, median of N runs.

    t = benchmark(lambda: forward(q, k, v))
    t.ms                       # median milliseconds
    t.tflops(attention_flops(B, H, T, T, d, causal))
    t.gbps(nbytes)

Also: the FLOP count of attention, and a small table printer that notebooks and the command line share.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ._core import cp, require_gpu


@dataclass(frozen=True)
class Timing:
    ms: float  # median
    min_ms: float
    max_ms: float
    runs: int
    samples: list = field(repr=False, default_factory=list)

    def tflops(self, flops: float) -> float:
        return flops / (self.ms * 1e-3) / 1e12

    def gbps(self, nbytes: float) -> float:
        return nbytes / (self.ms * 1e-3) / 1e9


def benchmark(fn, *, warmup: int = 3, runs: int = 20, stream=None) -> Timing:
    """Time fn() on the GPU with CUDA events: `warmup` untimed calls, then `runs` timed ones.

    Each run is bracketed by its own pair of events on the current stream, so launch gaps between
    runs are not counted, and the median is reported.
    """
    require_gpu()
    if runs < 1:
        raise ValueError(f"runs must be >= 1; got {runs}")
    stream = stream or cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end))
    return Timing(statistics.median(samples), min(samples), max(samples), runs, samples)


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
    columns = columns or list(rows[0])

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
