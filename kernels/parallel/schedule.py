"""Who holds which part of the sequence, and what each rank computes at each step of the ring (pure Python).

The sequence of T tokens is cut into equal chunks of C tokens (the last ones padded, see below):

    contiguous   N chunks; rank r holds chunk r                       (plain ring, and the all-to-all schedule)
    zigzag       2N chunks; rank r holds chunks r and 2N-1-r          (head-tail: an early chunk and a late one)

At step s of the ring, rank r holds the K and V of rank (r - s) mod N. Each (query chunk, key chunk) pair is

    full     every query of the chunk sees every key (the key chunk lies wholly before, or there is no mask)
    causal   the diagonal pair: query i sees key j <= i (q and k are the same chunk, so top-left = bottom-right)
    skip     every key lies after every query: nothing to compute

and `calls` groups the pairs of a step into as few calls of the local attention as the layout allows. This module is
the single source of the schedule: the algorithm (context.py) runs it, and notebook 14 draws and counts it.

Padding: C = ceil(T / chunks); the chunks past T are padded with zeros at the end of the sequence. Under a causal
mask a real query never sees a padded key (they all come later); without the mask the padded keys are cut off by
passing only the valid prefix of the keys (`valid_keys`).
"""

from __future__ import annotations

from typing import NamedTuple

LAYOUTS = ("contiguous", "zigzag")
SCHEDULES = {"ring": "contiguous", "zigzag": "zigzag", "alltoall": "contiguous"}


def num_chunks(world: int, layout: str) -> int:
    """How many chunks the sequence is cut into."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return world if layout == "contiguous" else 2 * world


def chunk_len(T: int, world: int, layout: str) -> int:
    """C = ceil(T / chunks): the tokens per chunk, padding included."""
    n = num_chunks(world, layout)
    return -(-T // n)


def chunks_of(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """The global chunk indices rank `rank` holds, in the order they sit in its local tensors."""
    num_chunks(world, layout)
    return (rank,) if layout == "contiguous" else (rank, 2 * world - 1 - rank)


def valid_len(chunk: int, C: int, T: int) -> int:
    """Tokens of global chunk `chunk` that are real (not padding)."""
    return max(0, min(C, T - chunk * C))


def source(rank: int, step: int, world: int) -> int:
    """The rank whose K and V rank `rank` holds at step `step` (they travel r -> r+1)."""
    return (rank - step) % world


def pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """'full', 'causal' or 'skip' for global query chunk q_chunk against key chunk k_chunk."""
    if not causal or q_chunk > k_chunk:
        return "full"
    return "causal" if q_chunk == k_chunk else "skip"


class Call(NamedTuple):
    """One call of the local attention: local query chunks [q0, q1) against local key chunks [k0, k1)."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def pairs(rank: int, step: int, world: int, layout: str, causal: bool) -> dict:
    """{(local q chunk, local k chunk): kind} for rank `rank` at step `step`."""
    mine = chunks_of(rank, world, layout)
    theirs = chunks_of(source(rank, step, world), world, layout)
    return {(i, j): pair_kind(qc, kc, causal) for i, qc in enumerate(mine) for j, kc in enumerate(theirs)}


def calls(rank: int, step: int, world: int, layout: str, causal: bool) -> list[Call]:
    """The local attention calls of one step, as few as the layout allows:
    every pair full -> one call of all queries on all keys; the lower triangle of the local chunks (full below the
    diagonal, causal on it, skip above: the zigzag's own step, where the concatenated local chunks are in causal
    order) -> one causal call on everything; otherwise per run of query chunks that see the same key chunks, one full
    call on a contiguous range of key chunks and one causal call for a diagonal pair."""
    kinds = pairs(rank, step, world, layout, causal)
    nq = nk = len(chunks_of(rank, world, layout))
    if all(k == "full" for k in kinds.values()):
        return [Call(0, nq, 0, nk, False)]
    if all(kinds[i, j] == ("full" if i > j else "causal" if i == j else "skip") for i, j in kinds):
        return [Call(0, nq, 0, nk, True)]
    rows = []  # per query chunk: (full key range or None, causal key chunk or None)
    for i in range(nq):
        full = [j for j in range(nk) if kinds[i, j] == "full"]
        diag = [j for j in range(nk) if kinds[i, j] == "causal"]
        if full and full != list(range(full[0], full[-1] + 1)):
            raise AssertionError(f"key chunks {full} of a full call are not contiguous")
        rows.append(((full[0], full[-1] + 1) if full else None, diag[0] if diag else None))
    out, i = [], 0
    while i < nq:
        j = i + 1
        while j < nq and rows[j] == rows[i] and rows[i][1] is None:  # merge query chunks with the same full keys
            j += 1
        full, diag = rows[i]
        if full:
            out.append(Call(i, j, full[0], full[1], False))
        if diag is not None:
            out.append(Call(i, j, diag, diag + 1, True))
        i = j
    return out


def work(world: int, layout: str, causal: bool) -> list[list[float]]:
    """work[rank][step]: chunk pairs computed, a causal diagonal pair counting one half (its FLOPs); in units of one
    full C x C pair."""
    return [[sum({"full": 1.0, "causal": 0.5, "skip": 0.0}[k] for k in pairs(r, s, world, layout, causal).values())
             for s in range(world)] for r in range(world)]


def messages(world: int, schedule: str, T: int, H: int, d: int, itemsize: int, grad_itemsize: int = 4) -> dict:
    """What one rank sends, forward and backward, in messages and bytes (B = 1; multiply the bytes by B).

    ring / zigzag: K and V (one message a step, N-1 steps) forward; backward K and V again (N-1) and the dK, dV
    accumulators (grad_itemsize bytes an element, N messages: the last one brings them home).
    alltoall: q, k, v to heads (one all-to-all), o back (one); backward dO, and the saved q, k, v, o, lse to heads
    (this code re-shards them), then dq, dk, dv back. An all-to-all sends (N-1)/N of its input."""
    layout = SCHEDULES[schedule]
    if world == 1:
        return {"fwd_messages": 0, "fwd_bytes": 0, "bwd_messages": 0, "bwd_bytes": 0}
    C = chunk_len(T, world, layout)
    local = C * len(chunks_of(0, world, layout)) * H * d  # elements of one local (Tl, H, d) tensor
    if schedule == "alltoall":
        frac = (world - 1) / world
        fwd = 4 * local * itemsize * frac
        bwd = (8 * local * itemsize + C * H * 4) * frac
        return {"fwd_messages": 2, "fwd_bytes": fwd, "bwd_messages": 3, "bwd_bytes": bwd}
    kv = 2 * local * itemsize
    return {"fwd_messages": world - 1, "fwd_bytes": (world - 1) * kv,
            "bwd_messages": 2 * world - 1, "bwd_bytes": (world - 1) * kv + world * 2 * local * grad_itemsize}
