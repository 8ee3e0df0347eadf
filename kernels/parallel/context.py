"""Attention over a sequence spread across ranks: ring (plain and zigzag) and all-to-all (Ulysses), forward and backward.

    from kernels.parallel import context as cp_attn
    q, k, v = (cp_attn.shard(x, rank, world, "zigzag") for x in (q_full, k_full, v_full))   # this rank's part
    o = cp_attn.attention(q, k, v, seq_len=T, schedule="zigzag", causal=True)              # differentiable
    o, lse = cp_attn.forward(q, k, v, seq_len=T, schedule="zigzag", causal=True)
    dq, dk, dv = cp_attn.backward(do, q, k, v, o, lse, seq_len=T, schedule="zigzag", causal=True)

Every rank passes its own part, (B, H, Tl, d) with Tl = shard_len(T, world, schedule); the whole sequence is never
on one rank. Schedules (schedule.py has the chunk layout and the per-step plan):

    ring      rank r holds chunk r of N; K and V travel round the ring (batch_isend_irecv to r+1, from r-1), N steps,
              each merged into the output by its LSE. Causal: the later ranks do more (rank 0 one diagonal block,
              rank N-1 N-1 full blocks and one diagonal): the imbalance.
    zigzag    rank r holds chunks r and 2N-1-r of 2N: every step is half a block of work on every rank (step 0: the
              two diagonals and one full pair), so no rank waits for another.
    alltoall  one all_to_all re-shards q, k, v from sequence to heads (each rank: H/N heads, the whole sequence), local
              attention, one all_to_all back. Needs H % N == 0.

Backward (ring, zigzag): K and V travel again; each rank adds its dK, dV for the block it holds into an accumulator
that travels with it (float32 on GPU) and reaches the block's owner after N sends; dQ stays local. The block
backward uses the saved global LSE and D = rowsum(dO * O) (see local.py).

On GPU the transfer of the next block is issued before this step's kernels and waited for after them: NCCL runs it on
its own stream, and work.wait() makes torch's current stream wait on NCCL's event, so the copy overlaps the compute and
the host never blocks inside the loop.

Checks: before any data moves, one all_gather_object of each rank's metadata (shapes, dtypes, T, causal, schedule,
scale, and any problem a rank found with its own inputs); every rank then runs the same checks on the same list
and raises the same ValueError, so bad input ends every rank with one message instead of a hang. Lengths that do
not divide: the sequence is padded at its end to chunks x C (shard() pads with zeros); a causal query never sees
the padded keys (they come after it), and without the mask the keys are cut to their valid prefix. The padded rows
of o are 0 and their dO is ignored. A world of one is allowed: the schedules reduce to one local call.
A dead rank: give the process group a timeout (init(), or init_process_group(timeout=...)); the collective that
waits on it then raises, and init() says so.
"""

from __future__ import annotations

import datetime
import math
import os

import torch
import torch.distributed as dist

from . import schedule as S
from .local import backend_for, merge_

SCHEDULES = tuple(S.SCHEDULES)
DEFAULT_TIMEOUT_S = 120

__all__ = ["SCHEDULES", "attention", "forward", "backward", "shard", "unshard", "gather", "shard_len", "init"]


# ---------------------------------------------------------------------------------------------------------
# Layout: whole sequence <-> this rank's part
# ---------------------------------------------------------------------------------------------------------

def _layout(schedule: str) -> str:
    if schedule not in S.SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
    return S.SCHEDULES[schedule]


def shard_len(T: int, world: int, schedule: str) -> int:
    """Tl: the sequence length of each rank's part (padding included)."""
    layout = _layout(schedule)
    return S.chunk_len(T, world, layout) * len(S.chunks_of(0, world, layout))


def shard(x, rank: int, world: int, schedule: str, dim: int = 2):
    """This rank's part of the whole-sequence tensor x (sequence along `dim`), padded with zeros to equal chunks."""
    layout = _layout(schedule)
    T = x.shape[dim]
    C = S.chunk_len(T, world, layout)
    pad = C * S.num_chunks(world, layout) - T
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_zeros(shape)], dim)
    return torch.cat([x.narrow(dim, c * C, C) for c in S.chunks_of(rank, world, layout)], dim).contiguous()


def unshard(parts, T: int, schedule: str, dim: int = 2):
    """The whole-sequence tensor from every rank's part (parts[r] from rank r), padding dropped."""
    world = len(parts)
    layout = _layout(schedule)
    C = parts[0].shape[dim] // len(S.chunks_of(0, world, layout))
    chunks = {}
    for r, p in enumerate(parts):
        for i, c in enumerate(S.chunks_of(r, world, layout)):
            chunks[c] = p.narrow(dim, i * C, C)
    return torch.cat([chunks[c] for c in range(S.num_chunks(world, layout))], dim).narrow(dim, 0, T)


def gather(x, T: int, schedule: str, group=None):
    """The whole-sequence tensor on every rank (an all_gather of the parts; for checks, not for speed)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard(parts, T, schedule)


def init(backend: str, timeout_s: float = DEFAULT_TIMEOUT_S, **kw):
    """init_process_group with a timeout, from torchrun's environment (or the keyword arguments): a rank that dies
    or stops answering makes the others' next collective raise after timeout_s seconds instead of waiting forever.
    With NCCL, also binds this process to GPU LOCAL_RANK."""
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------------------------------------
# The checks: one small all_gather of metadata, then the same verdict on every rank
# ---------------------------------------------------------------------------------------------------------

class Problem:
    """What every rank agreed on: the world, this rank, and the schedule's geometry."""

    def __init__(self, group, T, schedule, causal, scale, shape, backend):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.T, self.schedule, self.causal = T, schedule, causal
        self.layout = S.SCHEDULES[schedule]
        self.C = S.chunk_len(T, self.world, self.layout)
        self.B, self.H, self.Tl, self.d = shape
        self.scale = scale
        self.backend = backend
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) if group else (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) if group else (self.rank - 1) % self.world

    def valid_rows(self, rank: int | None = None):
        """[(start, stop)] of the padded rows of rank's part (empty when T divides evenly)."""
        rank = self.rank if rank is None else rank
        out = []
        for i, c in enumerate(S.chunks_of(rank, self.world, self.layout)):
            n = S.valid_len(c, self.C, self.T)
            if n < self.C:
                out.append((i * self.C + n, (i + 1) * self.C))
        return out


def _describe(t) -> dict:
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__}
    return {"shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "device": t.device.type}


def _local_problems(tensors: dict, backend) -> list[str]:
    out = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            out.append(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        elif name == "lse":
            if t.dim() != 3:
                out.append(f"lse must be 3-D (B, H, Tl); got shape {tuple(t.shape)}")
        elif t.dim() != 4:
            out.append(f"{name} must be 4-D (B, H, Tl, d); got shape {tuple(t.shape)}")
        elif t.dtype not in backend.dtypes:
            out.append(f"{name} has dtype {t.dtype}; the {backend.name} backend takes "
                       f"{', '.join(str(d).removeprefix('torch.') for d in backend.dtypes)}")
        elif t.device.type != backend.device_type:
            out.append(f"{name} is on {t.device}; the {backend.name} backend runs on {backend.device_type} tensors")
    return out


def _disagreement(metas: list, key: str) -> str | None:
    values = [m[key] for m in metas]
    if all(v == values[0] for v in values):
        return None
    by_value: dict = {}
    for r, v in enumerate(values):
        by_value.setdefault(repr(v), []).append(r)
    return f"the ranks disagree on {key}: " + "; ".join(f"rank{'s' if len(rs) > 1 else ''} "
                                                      f"{','.join(map(str, rs))} {v}" for v, rs in by_value.items())


def check_inputs(tensors: dict, *, seq_len, schedule, causal, scale, group, backend, what: str) -> Problem:
    """Gather every rank's metadata (one all_gather_object) and raise the same ValueError on every rank for:
    a problem any rank found with its own tensors, ranks that disagree (shapes, dtypes, seq_len, causal, schedule,
    scale), a part length that does not match seq_len, k or v shaped unlike q, heads the all-to-all cannot split."""
    q = tensors["q"]
    try:  # nothing may raise before the all_gather: the other ranks would wait in it
        backend = backend_for(backend if backend is not None else q if isinstance(q, torch.Tensor) else "reference")
        problems = _local_problems(tensors, backend)
    except Exception as e:  # noqa: BLE001 - an unknown name, or the cuda backend cannot load here
        backend, problems = None, [f"backend {backend!r}: {type(e).__name__}: {e}"]
    meta = {"tensors": {n: _describe(t) for n, t in tensors.items()}, "seq_len": seq_len, "causal": bool(causal),
            "schedule": schedule, "scale": scale, "backend": getattr(backend, "name", None), "problems": problems}
    world = dist.get_world_size(group)
    metas = [None] * world
    try:
        dist.all_gather_object(metas, meta, group=group)
    except Exception as e:  # a rank died, or never called: the group's timeout ended the wait
        raise RuntimeError(f"rank {dist.get_rank(group)}: {what}: the metadata all_gather failed; a rank died or did "
                           f"not call {what} within the process group's timeout ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200]})") from e
    errors: dict = {}
    for r, m in enumerate(metas):
        for p in m["problems"]:
            errors.setdefault(p, []).append(r)
    if errors:
        raise ValueError(f"{what}: " + "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {p}"
                                                 for p, rs in errors.items()))
    for m in metas:  # one key per tensor and field: "q.shape", "k.dtype", ...
        m.update({f"{n}.{f}": v for n, t in m["tensors"].items() for f, v in t.items()})
    keys = ["schedule", "seq_len", "causal", "scale", "backend"] + [k for k in metas[0] if "." in k]
    for key in keys:
        msg = _disagreement(metas, key)
        if msg:
            raise ValueError(f"{what}: {msg}")
    if schedule not in S.SCHEDULES:
        raise ValueError(f"{what}: schedule must be one of {SCHEDULES}; got {schedule!r}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"{what}: seq_len must be an int >= 1 (the whole sequence's length); got {seq_len!r}")
    shapes = meta["tensors"]
    B, H, Tl, d = shapes["q"]["shape"]
    for name in ("k", "v", "o", "do"):
        if name in shapes and shapes[name]["shape"] != (B, H, Tl, d):
            raise ValueError(f"{what}: {name}.shape is {shapes[name]['shape']}; it must equal q.shape {(B, H, Tl, d)} "
                             "(self-attention: every rank holds the same positions of q, k and v)")
    if "lse" in shapes and shapes["lse"]["shape"] != (B, H, Tl):
        raise ValueError(f"{what}: lse.shape is {shapes['lse']['shape']}; it must be {(B, H, Tl)}")
    dtypes = {n: m["dtype"] for n, m in shapes.items() if n != "lse"}
    if len(set(dtypes.values())) > 1:
        raise ValueError(f"{what}: q, k, v (and o, do) must share one dtype; got {dtypes}")
    need = shard_len(seq_len, world, schedule)
    if Tl != need:
        layout = S.SCHEDULES[schedule]
        n = S.num_chunks(world, layout)
        raise ValueError(f"{what}: q.shape[2] is {Tl} on every rank, but seq_len={seq_len} over {world} ranks with the "
                         f"{schedule} schedule needs {need} per rank ({len(S.chunks_of(0, world, layout))} x a chunk of "
                         f"ceil({seq_len}/{n}) = {S.chunk_len(seq_len, world, layout)}, the end padded): make the "
                         f"parts with shard()")
    if schedule == "alltoall" and H % world:
        raise ValueError(f"{what}: q.shape[1] (heads) is {H}, not a multiple of the world size {world}: the alltoall "
                         f"schedule gives each rank H/{world} heads (use ring or zigzag, or a world that divides H)")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{what}: scale must be a finite number > 0; got {scale!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return Problem(group, seq_len, schedule, bool(causal), scale, (B, H, Tl, d), backend)


# ---------------------------------------------------------------------------------------------------------
# Ring and zigzag
# ---------------------------------------------------------------------------------------------------------

def _exchange(send, recv, P: Problem):
    """Send `send` to the next rank and receive the previous rank's into `recv`; returns the works to wait on."""
    ops = [dist.P2POp(dist.isend, send, P.next, P.group), dist.P2POp(dist.irecv, recv, P.prev, P.group)]
    return dist.batch_isend_irecv(ops)


class _Rows:
    """Contiguous copies of a range of local chunks of a tensor, made once (a row range of a (B, H, Tl, d) tensor is
    not contiguous when B H > 1, and the kernels take contiguous tensors)."""

    def __init__(self, t, C: int):
        self.t, self.C, self.cache = t, C, {}

    def __call__(self, c0: int, c1: int):
        if (c0, c1) not in self.cache:
            n = self.t.shape[2] // self.C
            self.cache[c0, c1] = self.t if (c0, c1) == (0, n) else self.t[:, :, c0 * self.C:c1 * self.C].contiguous()
        return self.cache[c0, c1]


def _keys(P: Problem, src: int, c: S.Call) -> tuple[int, int]:
    """(first row, row count) of the keys a call uses in the source rank's part: without a mask only the valid prefix
    (the padding is always a suffix of the part's chunks), with it all of them (padded keys come after every query)."""
    start = c.k0 * P.C
    if P.causal:
        return start, (c.k1 - c.k0) * P.C
    mine = S.chunks_of(src, P.world, P.layout)[c.k0:c.k1]
    return start, sum(S.valid_len(ch, P.C, P.T) for ch in mine)


def _kv_rows(kv, start: int, n: int, full: int):
    k, v = kv[0], kv[1]
    if start == 0 and n == full:
        return k, v
    return k[:, :, start:start + n].contiguous(), v[:, :, start:start + n].contiguous()


def _zero_padding_(x, P: Problem) -> None:
    for a, b in P.valid_rows():
        x[:, :, a:b] = 0


def _accumulate(o_acc, lse_acc, o, lse, c: S.Call, P: Problem, unwritten: set) -> None:
    """The partial (o, lse) of call c into the running output: copied where it is the first for its query chunks (a
    merge into (0, -inf) gives the same values in three more passes over o), merged by LSE where it is not."""
    r0, r1 = c.q0 * P.C, c.q1 * P.C
    chunks = set(range(c.q0, c.q1))
    if chunks <= unwritten:
        o_acc[:, :, r0:r1].copy_(o)
        lse_acc[:, :, r0:r1].copy_(lse)
    else:
        merge_(o_acc[:, :, r0:r1], lse_acc[:, :, r0:r1], o, lse)
    unwritten -= chunks


def _ring_forward(q, k, v, P: Problem):
    be = P.backend
    o_acc = torch.zeros(q.shape, dtype=be.acc_dtype, device=q.device)
    lse_acc = torch.full(q.shape[:3], -math.inf, dtype=be.acc_dtype, device=q.device)
    kv, spare = torch.stack([k, v]), None
    rows = _Rows(q, P.C)
    unwritten = set(range(P.Tl // P.C))  # local query chunks no partial has reached yet
    for step in range(P.world):
        src = S.source(P.rank, step, P.world)
        works = []
        if step + 1 < P.world:  # the next block's transfer, issued before this block's kernels
            spare = torch.empty_like(kv) if spare is None else spare
            works = _exchange(kv, spare, P)
        for c in S.calls(P.rank, step, P.world, P.layout, P.causal):
            start, n = _keys(P, src, c)
            if n == 0:
                continue
            ks, vs = _kv_rows(kv, start, n, P.Tl)
            o, lse = be.forward(rows(c.q0, c.q1), ks, vs, c.causal, P.scale)
            _accumulate(o_acc, lse_acc, o, lse, c, P, unwritten)
        for w in works:  # on GPU: torch's stream waits for NCCL's event; the host does not block
            w.wait()
        if works:
            kv, spare = spare, kv
    _zero_padding_(o_acc, P)
    return o_acc.to(q.dtype), lse_acc


def _ring_backward(do, q, k, v, o, lse, P: Problem):
    be = P.backend
    acc = be.acc_dtype
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv, spare = torch.stack([k, v]), None
    rows = {name: _Rows(t, P.C) for name, t in (("q", q), ("do", do), ("o", o))}
    lse_rows = {}
    dkv_in, pending = None, []
    for step in range(P.world):
        src = S.source(P.rank, step, P.world)
        works = []
        if step + 1 < P.world:
            spare = torch.empty_like(kv) if spare is None else spare
            works = _exchange(kv, spare, P)
        part = torch.zeros(kv.shape, dtype=acc, device=q.device)  # this rank's dK, dV for the block it holds
        for c in S.calls(P.rank, step, P.world, P.layout, P.causal):
            start, n = _keys(P, src, c)
            if n == 0:
                continue
            ks, vs = _kv_rows(kv, start, n, P.Tl)
            r0, r1 = c.q0 * P.C, c.q1 * P.C
            if (r0, r1) not in lse_rows:
                lse_rows[r0, r1] = lse if (r0, r1) == (0, P.Tl) else lse[:, :, r0:r1].contiguous()
            g = be.backward(rows["do"](c.q0, c.q1), rows["q"](c.q0, c.q1), ks, vs, rows["o"](c.q0, c.q1),
                            lse_rows[r0, r1], c.causal, P.scale)
            dq[:, :, r0:r1] += g[0]
            part[0][:, :, start:start + n] += g[1]
            part[1][:, :, start:start + n] += g[2]
        if pending:  # the accumulator of this block, from the ranks it visited before
            for w in pending:
                w.wait()
            part += dkv_in
        if P.world > 1:  # on to the next rank; after the N-th send it is home
            dkv_in = torch.empty_like(part) if dkv_in is None else dkv_in
            pending = _exchange(part, dkv_in, P)
        for w in works:
            w.wait()
        if works:
            kv, spare = spare, kv
    for w in pending:
        w.wait()
    dkv = dkv_in if P.world > 1 else part
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


# ---------------------------------------------------------------------------------------------------------
# All-to-all (Ulysses)
# ---------------------------------------------------------------------------------------------------------

def _to_heads(xs, P: Problem):
    """n parts of the sequence, each (B, H, Tl, d) -> (n, B, H/N, N Tl, d): all heads' pieces of my head group, whole
    sequence (one all_to_all_single; the n tensors travel together, copied straight into the send buffer)."""
    B, H, Tl, d = xs[0].shape
    N = P.world
    send = xs[0].new_empty(N, len(xs), B, H // N, Tl, d)  # (dest = head group, n, B, H/N, Tl, d)
    for i, x in enumerate(xs):
        send[:, i].copy_(x.reshape(B, N, H // N, Tl, d).transpose(0, 1))
    recv = torch.empty_like(send)  # (source = sequence chunk, n, B, H/N, Tl, d)
    dist.all_to_all_single(recv, send, group=P.group)
    return recv.permute(1, 2, 3, 0, 4, 5).reshape(len(xs), B, H // N, N * Tl, d)


def _to_sequence(xs, P: Problem):
    """The inverse of _to_heads: n tensors (B, H/N, N Tl, d) -> (n, B, H, Tl, d), each tensor in the dtype of the
    first."""
    B, h, T, d = xs[0].shape
    N = P.world
    send = xs[0].new_empty(N, len(xs), B, h, T // N, d)  # (dest = chunk, n, B, h, Tl, d)
    for i, x in enumerate(xs):
        send[:, i].copy_(x.reshape(B, h, N, T // N, d).permute(2, 0, 1, 3, 4))
    recv = torch.empty_like(send)  # (source = head group, n, B, h, Tl, d)
    dist.all_to_all_single(recv, send, group=P.group)
    return recv.permute(1, 2, 0, 3, 4, 5).reshape(len(xs), B, N * h, T // N, d)


def _heads_keys(P: Problem) -> int:
    return P.Tl * P.world if P.causal else P.T  # without a mask, the valid prefix only


def _alltoall_forward(q, k, v, P: Problem):
    qh, kh, vh = _to_heads([q, k, v], P)
    n = _heads_keys(P)
    ks, vs = (kh, vh) if n == kh.shape[2] else (kh[:, :, :n].contiguous(), vh[:, :, :n].contiguous())
    o, lse = P.backend.forward(qh.contiguous(), ks, vs, P.causal, P.scale)
    o = _to_sequence([o.to(q.dtype)], P)[0]  # a fresh tensor: _zero_padding_ may write it
    lse = _to_sequence([lse[..., None]], P)[0, ..., 0]
    _zero_padding_(o, P)
    return o, lse.contiguous()


def _alltoall_backward(do, q, k, v, o, lse, P: Problem):
    qh, kh, vh, oh, doh = _to_heads([q, k, v, o, do], P)
    lseh = _to_heads([lse[..., None]], P)[0, ..., 0].contiguous()
    n = _heads_keys(P)
    ks, vs = (kh, vh) if n == kh.shape[2] else (kh[:, :, :n].contiguous(), vh[:, :, :n].contiguous())
    dq, dk, dv = P.backend.backward(doh, qh, ks, vs, oh, lseh, P.causal, P.scale)
    if n < kh.shape[2]:
        dk, dv = (torch.cat([g, g.new_zeros(g.shape[:2] + (kh.shape[2] - n, g.shape[3]))], 2) for g in (dk, dv))
    dq, dk, dv = _to_sequence([dq.to(q.dtype), dk, dv], P)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------------------
# What a model calls
# ---------------------------------------------------------------------------------------------------------

def forward(q, k, v, *, seq_len: int, schedule: str = "zigzag", causal: bool = False, scale=None, group=None,
            backend=None, check: bool = True, problem: Problem | None = None):
    """(o, lse) of this rank's part of the attention of the whole sequence (see the module's docstring).

    q, k, v: this rank's (B, H, Tl, d) parts (shard()); seq_len: the whole sequence's length T; backend: "cuda",
    "reference" or None (by q's device). check=False skips the metadata all_gather (pass the Problem a checked
    call returned as problem= to reuse its geometry): for timing loops, after one checked call."""
    P = problem
    if P is None or check:
        P = check_inputs({"q": q, "k": k, "v": v}, seq_len=seq_len, schedule=schedule, causal=causal, scale=scale,
                         group=group, backend=backend, what="context-parallel attention forward")
    if P.schedule == "alltoall":
        return _alltoall_forward(q, k, v, P)
    return _ring_forward(q, k, v, P)


def backward(do, q, k, v, o, lse, *, seq_len: int, schedule: str = "zigzag", causal: bool = False, scale=None,
             group=None, backend=None, check: bool = True, problem: Problem | None = None):
    """(dq, dk, dv) of this rank's parts, from the upstream gradient do of its part of o (rows of padding ignored)."""
    P = problem
    if P is None or check:
        P = check_inputs({"q": q, "k": k, "v": v, "o": o, "do": do, "lse": lse}, seq_len=seq_len, schedule=schedule,
                         causal=causal, scale=scale, group=group, backend=backend,
                         what="context-parallel attention backward")
    if P.valid_rows():
        do = do.clone()
        _zero_padding_(do, P)
    if P.schedule == "alltoall":
        return _alltoall_backward(do, q, k, v, o, lse, P)
    return _ring_backward(do, q, k, v, o, lse, P)


def problem_of(q, k, v, **kw) -> Problem:
    """The checked Problem (one metadata all_gather), to pass as problem= with check=False in a loop."""
    kw = {key: kw[key] for key in ("seq_len", "schedule", "causal", "scale", "group", "backend") if key in kw}
    kw.setdefault("schedule", "zigzag")
    kw.setdefault("causal", False)
    kw.setdefault("scale", None)
    kw.setdefault("group", None)
    kw.setdefault("backend", None)
    return check_inputs({"q": q, "k": k, "v": v}, what="context-parallel attention", **kw)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kw):
        P = problem_of(q, k, v, **kw) if kw.get("problem") is None else kw["problem"]
        o, lse = forward(q, k, v, seq_len=P.T, check=False, problem=P)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.problem = P
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(do.contiguous(), q, k, v, o, lse, seq_len=ctx.problem.T, check=False,
                              problem=ctx.problem)
        return dq, dk, dv, None


def attention(q, k, v, *, seq_len: int, schedule: str = "zigzag", causal: bool = False, scale=None, group=None,
              backend=None, problem: Problem | None = None):
    """o for this rank's part, differentiable in q, k, v (the backward above)."""
    return _Attention.apply(q, k, v, dict(seq_len=seq_len, schedule=schedule, causal=causal, scale=scale,
                                          group=group, backend=backend, problem=problem))
