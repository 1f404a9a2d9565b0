"""The next weights into L2 while a latency-bound decode GEMV runs (issue 12).

A one-row decode step streams 4.4 GB of weights (the 7B), but not at one rate: gate+up, down
and the lm head read their planes at 2.6-3.7 TB/s, while q/k/v and o (7-9 MB each) take 6-7 us,
~1.3 TB/s, bound by the latency of a few dependent load rounds, and the norm, rope, attention
and combine kernels between them read almost nothing. During those ~25 us per layer the memory
is mostly idle. The weights are never written by the step, so the later GEMVs' planes can be
fetched into L2 then (H200: 50 MB of L2), and read from there when their kernel runs.

Mechanism: a q8 GEMV launch (gemv_q8.gemv_q8) may carry up to MAX_REGIONS byte ranges of
later weights' planes; each of its programs issues one `cp.async.bulk.prefetch.L2.global`
(sm_90's bulk prefetch, PTX ISA 8.0: a 16-byte-aligned address, a size that is a multiple of
16; no completion to wait for) for its 1/P share of each range, from one thread, before it
waits for the previous kernel (pdl.py: weights may be read before the wait). Nothing the kernel
computes depends on it: the outputs are the same bits with and without (tests/gpu).

Which ranges (L2Plan): the decode's q8 GEMV launches repeat in one order every step. The plan
learns it from the eager calls (the CUDA-graph capture's warm-up forwards run eagerly first): a
launch is keyed by its planes' addresses; when a key comes back, the launches from its first
occurrence on are one step's cycle. Then, in cycle order, every *small* launch (planes under
`small` bytes: q/k/v, o) claims up to `budget` bytes of the planes that follow it -- whole small
weights (o after q/k/v), then the head rows of the first large one (gate+up), and stops there;
bytes an earlier launch claimed are not claimed twice. With `big_next`, a large launch
(down, the lm head) claims the next launch's planes when that one is small (the next layer's
q/k/v). Until the cycle is known (the first forward), launches prefetch nothing.

Measured on the H200 (docs/perf-log.md T1): negative. A GEMV reading its planes from L2 is at
most 13% faster (the kernels are bound by instructions and latency, not HBM), and the prefetches
slow the launches that issue them: end to end 0.90-0.99x. Off by default (l2_prefetch_mb = 0).
"""

from __future__ import annotations

import triton
import triton.language as tl

MAX_REGIONS = 8
MAX_HEAD_PLANES = 4                  # a Q6_K weight's planes (Q4_K: 3)
_ALIGN = 16


@triton.jit
def _region(addr, nbytes, pid, nprog, NT: tl.constexpr):
    """This program's share of one range: bytes [pid * chunk, +chunk) of [addr, addr + nbytes),
    chunk a multiple of 16 (addr and nbytes are, the plan aligns them), from lane 0 only."""
    chunk = (nbytes // 16 + nprog - 1) // nprog * 16
    off = pid.to(tl.int64) * chunk
    ln = tl.minimum(chunk, nbytes - off)
    lane = tl.arange(0, NT)
    go = ((lane == 0) & (ln > 0)).to(tl.int32)
    a = addr + off + lane.to(tl.int64) * 0
    n = (tl.maximum(ln, 0) + lane * 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, 0; @p cp.async.bulk.prefetch.L2.global [$2], $3; mov.u32 $0, 0; }",
        "=r,r,l,r", [go, a, n], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_regions(a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5, a6, n6, a7, n7,
                     NPF: tl.constexpr, NT: tl.constexpr):
    """Each program of the grid its share of the first NPF ranges (a_i: int64 address, n_i bytes)."""
    if NPF > 0:
        pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
        nprog = tl.num_programs(0) * tl.num_programs(1)
        _region(a0, n0, pid, nprog, NT)
        if NPF > 1:
            _region(a1, n1, pid, nprog, NT)
        if NPF > 2:
            _region(a2, n2, pid, nprog, NT)
        if NPF > 3:
            _region(a3, n3, pid, nprog, NT)
        if NPF > 4:
            _region(a4, n4, pid, nprog, NT)
        if NPF > 5:
            _region(a5, n5, pid, nprog, NT)
        if NPF > 6:
            _region(a6, n6, pid, nprog, NT)
        if NPF > 7:
            _region(a7, n7, pid, nprog, NT)


def region_args(regions) -> tuple:
    """(kernel args a0, n0, .. a7, n7; NPF) for a list of (address, bytes)."""
    regions = list(regions)[:MAX_REGIONS]
    flat = []
    for a, n in regions + [(0, 0)] * (MAX_REGIONS - len(regions)):
        flat += [int(a), int(n)]
    return tuple(flat), len(regions)


def _row_bytes(rw) -> list[int]:
    """Bytes of one row in each plane (every plane is (N, ...) with rows apart by stride(0))."""
    return [p.stride(0) * p.element_size() for p in rw.planes]


def _nbytes(segs) -> int:
    return sum(r.nbytes() for r in segs)


def _key(segs) -> tuple:
    return tuple(r.planes[0].data_ptr() for r in segs)


def tile_heads(rw, h: int) -> list | None:
    """The first h K blocks of every row tile of a tile-major Repacked, per plane: [tiles, (address,
    tile bytes, head bytes) per plane] (gemv_repack_layout.to_tiles: tile T's block b is the plane's
    per-block entries ((T * NB + b) * t ..), so a tile is one run of t * NB entries and its first h
    blocks the run's first t * h); planes whose runs are not whole 16 bytes (the bulk prefetch's
    unit) are left out; None when none is left."""
    t, nb = rw.tile_rows, rw.k // 256
    h = min(h, nb)
    out = [rw.n // t]
    for p in rw.planes:
        per = p.numel() * p.element_size() // (rw.n * nb)      # bytes of one row's block in this plane
        run, head = t * nb * per, t * h * per
        if run % _ALIGN or head % _ALIGN or p.data_ptr() % _ALIGN:
            continue
        out.append((p.data_ptr(), run, head))
    return out if len(out) > 1 else None


class L2Plan:
    """The decode's q8 GEMV launches in cycle order and, per launch, what it prefetches (module doc).
    One per engine workspace (gemv_repack.GemvWorkspace.l2)."""

    def __init__(self):
        self.order: list = []        # [(key, segs)] seen since learning began
        self.cycle: list | None = None
        self.index: dict = {}        # key -> position in the cycle
        self._regions: dict = {}     # (budget, small, big_next) -> [regions per cycle position]
        self._heads: dict = {}       # (pos, h) -> the heads arguments or None

    def note(self, segs) -> int | None:
        """The launch's position in the cycle (None while the cycle is being learned, or for a
        launch that is not part of it)."""
        key = _key(segs)
        if self.cycle is not None:
            return self.index.get(key)
        for i, (k, _) in enumerate(self.order):
            if k == key:
                self.cycle = [s for _, s in self.order[i:]]
                self.index = {_key(s): j for j, s in enumerate(self.cycle)}
                self.order = []
                return self.index[key]
        self.order.append((key, tuple(segs)))
        return None

    def regions(self, pos: int, budget: int, small: int, big_next: bool) -> list:
        """[(address, bytes)] the launch at cycle position pos prefetches (16-byte aligned)."""
        k = (budget, small, bool(big_next))
        plan = self._regions.get(k)
        if plan is None:
            plan = self._regions[k] = self._plan(budget, small, big_next)
        return plan[pos]

    def head_ranges(self, pos: int, h: int, ratio: int = 4) -> list | None:
        """The launch at cycle position pos and the one after it: when that next launch is one
        tile-major weight of at least `ratio` x this launch's bytes (the 7B: o, then gate+up), its
        tile_heads(.., h); None otherwise."""
        cyc = self.cycle or []
        if h <= 0 or not cyc or pos is None:
            return None
        nxt = cyc[(pos + 1) % len(cyc)]
        if len(nxt) != 1 or not nxt[0].tile_rows or _nbytes(nxt) < ratio * _nbytes(cyc[pos]):
            return None
        return tile_heads(nxt[0], h)

    def heads(self, pos: int | None, h: int) -> tuple | None:
        """head_ranges as the Gluon kernel takes them, scalar arguments (a CUDA graph keeps them in its
        nodes; no table to copy, which a capture would refuse): (planes, (tiles, then address, tile
        bytes, head bytes for each of MAX_HEAD_PLANES planes, zeros past the real ones)); None when
        none."""
        key = (pos, h)
        if key not in self._heads:
            r = self.head_ranges(pos, h) if pos is not None else None
            self._heads[key] = None if r is None else (
                len(r) - 1, tuple([r[0]] + [v for pl in r[1:] for v in pl] + [0] * 3 * (MAX_HEAD_PLANES + 1 - len(r))))
        return self._heads[key]

    def _plan(self, budget: int, small: int, big_next: bool) -> list:
        cyc = self.cycle or []
        n = len(cyc)
        claimed = [[0] * len(s) for s in cyc]     # per launch, per segment: rows claimed so far
        out = []
        for i, segs in enumerate(cyc):
            regs: list = []
            is_small = _nbytes(segs) < small
            if is_small and budget > 0:
                rem = budget
                for d in range(1, n):
                    j = (i + d) % n
                    rem = self._claim(cyc[j], claimed[j], rem, regs)
                    if rem <= 0 or _nbytes(cyc[j]) >= small or len(regs) >= MAX_REGIONS:
                        break
            elif not is_small and big_next and n > 1:
                j = (i + 1) % n
                if _nbytes(cyc[j]) < small:
                    self._claim(cyc[j], claimed[j], _nbytes(cyc[j]), regs)
            out.append(regs[:MAX_REGIONS])
        return out

    @staticmethod
    def _claim(segs, claimed: list, rem: int, regs: list) -> int:
        """Claim up to rem bytes of segs' rows not claimed yet (whole rows, every plane of a row):
        regions appended; the bytes left of rem."""
        for si, rw in enumerate(segs):
            rb = _row_bytes(rw)
            per_row = sum(rb)
            r0 = claimed[si]
            rows = min(rw.n - r0, rem // per_row)
            if rows <= 0:
                if rw.n - r0 > 0:
                    return 0               # not even one row fits: the budget is spent
                continue
            for p, b in zip(rw.planes, rb):
                a = p.data_ptr() + r0 * b
                e = a + rows * b
                a16 = -(-a // _ALIGN) * _ALIGN
                e16 = e // _ALIGN * _ALIGN
                if e16 > a16:
                    regs.append((a16, e16 - a16))
            claimed[si] = r0 + rows
            rem -= rows * per_row
            if claimed[si] < rw.n:
                return 0
        return rem
