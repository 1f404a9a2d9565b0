"""What does a grid-wide barrier cost against the launch hand-off it would replace? (issue 12 stretch,
perf-log AU4: a persistent decode layer would trade ~7 launch boundaries a layer for grid syncs.) On the GPU:
    python3 tools/grid_sync_probe.py [--phases 196] [--bytes LIST] [--programs-per-sm 1] [--json OUT]
P phases; phase p streams --bytes[p % len] bytes of a weight buffer (each byte read once a repetition, a
rotation of >= 200 MB: from HBM). Each of the grid's programs (SMs x --programs-per-sm) sums its slice (16-byte
loads, --block int32 a step) and stores sum + 0.5 * (program pid + 1's output of phase p - 1): a dependency
on another program. The default bytes: roughly one 7B layer's 7 launches (perf-log: q/k/v 9.3 MB, attention ~0.3
of cache, combine 0, o 7.2, gate+up 76, SwiGLU 0.15, down Q4_K 38), 28 layers. Rows:
  floor          one launch, each program streams all its slices without syncs (the dependency is racy)
  chain(+pdl)    P launches, without / with PDL (the first --pre tiles loaded before griddepcontrol.wait)
  persist[q]     one launch, a grid barrier between phases: an acq_rel arrival counter and a generation the
                 waiters poll with ld.acquire.gpu, by [one] thread a program (broadcast through shared memory:
                 what Triton makes of atomic_add(0, acquire)) or [all] threads (no CTA sync in the loop)
  persist+pre[q] the same, each phase's first --pre tiles loaded BEFORE the barrier (weights need no sync)
  empty ...      no bytes: the bare hand-off (launch or barrier) with its one-float dependency
Columns: us/rep (CUDA graph of --reps repetitions, median replay / reps), GB/s (weight bytes / us/rep),
us/phase over floor ((us/rep - floor's) / P; empty rows: us/rep / P), us/phase over copy ((us/rep - the
bytes at torch's copy rate, read + write) / P), check (outputs bit-equal to a torch reference; floor: racy).
Deadlock guard: a barrier needs every program resident. The grid is refused when the compiled kernel's
registers / threads / shared memory fit fewer than --programs-per-sm an SM, and a waiter gives up after
--spin-limit polls (error word = phase + 1, no later waits): the tool stops with that error, no hang."""
from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

GEN = tl.constexpr(32)                 # the generation word's index in the barrier buffer: its own 128-byte line
MIN_ROTATION = 200e6        # bytes read between two reads of the same weight byte (L2: 50 MB on H100/H200)
DEFAULT_BYTES = "9.3e6,0.3e6,0,7.2e6,76e6,0.15e6,38e6"
POLLS = ["one", "all"]      # _grid_barrier's POLL 0 / 1


@triton.jit
def _geometry(off, n, per, pid):
    """Program pid's slice of a phase: first element (int64) and element count (a multiple of 16)."""
    cnt = tl.minimum(tl.maximum(n - pid * per, 0), per)
    return tl.multiple_of(off.to(tl.int64) + pid * per, 16), tl.multiple_of(cnt, 16)


@triton.jit
def _tile(w, base, cnt, t, BLOCK: tl.constexpr):
    i = t + tl.arange(0, BLOCK)
    return tl.load(w + base + i, mask=i < cnt, other=0)


@triton.jit
def _finish(w, outs, base, cnt, acc, t0, dep, p, pid, G, BLOCK: tl.constexpr):
    for t in range(t0, cnt, BLOCK):
        acc += _tile(w, base, cnt, t, BLOCK)
    tl.store(outs + (p + 1) * G + pid, tl.sum(acc).to(tl.float32) + 0.5 * dep)


@triton.jit
def _phase_kernel(w, outs, p, off, n, per, G, BLOCK: tl.constexpr, PDL: tl.constexpr, PRE: tl.constexpr):
    """One phase as its own launch; with PDL its first PRE tiles are loaded before griddepcontrol.wait."""
    pid = tl.program_id(0)
    base, cnt = _geometry(off, n, per, pid)
    acc = tl.zeros([BLOCK], tl.int32)
    for j in tl.static_range(PRE):
        acc += _tile(w, base, cnt, j * BLOCK, BLOCK)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    dep = tl.load(outs + p * G + (pid + 1) % G)
    _finish(w, outs, base, cnt, acc, PRE * BLOCK, dep, p, pid, G, BLOCK)


@triton.jit
def _grid_barrier(bar, err, G, spin_limit, failed, p, POLL: tl.constexpr):
    """All G programs wait here; their stores before it are visible to all after it. bar[0] counts arrivals
    (the last one resets it, so graph replays reuse it), bar[GEN] is the generation, read before arriving
    (it cannot move before this program arrives): the last arrival bumps it with a release, the others
    poll it with acquire until it moves, at most spin_limit times (then err = max(err, phase + 1) and this
    program, `failed`, waits at no later barrier: a grid that is not all resident ends, it does not hang)."""
    tl.debug_barrier()                       # every thread's stores before the one thread's release
    gen = tl.atomic_add(bar + GEN, 0, sem="relaxed", scope="gpu")
    old = tl.atomic_add(bar, 1, sem="acq_rel", scope="gpu")
    if old == G - 1:
        tl.atomic_xchg(bar, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(bar + GEN, 1, sem="release", scope="gpu")
    else:
        cur, spins, lim = gen, 0, spin_limit * (1 - failed)
        while (cur == gen) & (spins < lim):
            if POLL == 0:
                cur = tl.atomic_add(bar + GEN, 0, sem="acquire", scope="gpu")
            else:
                cur = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [bar + GEN],
                                                dtype=tl.int32, is_pure=False, pack=1)
            spins += 1
        if cur == gen:
            tl.atomic_max(err, p + 1, sem="relaxed", scope="gpu")
            failed = failed * 0 + 1
    tl.debug_barrier()                       # the acquire before any thread's dependent load
    return failed


@triton.jit
def _persistent_kernel(w, outs, sched, bar, err, P, G, spin_limit, BLOCK: tl.constexpr, PRE: tl.constexpr,
                       SYNC: tl.constexpr, POLL: tl.constexpr):
    """All P phases in one launch; sched: int32 [P, 3] of (offset, elements, elements a program)."""
    pid = tl.program_id(0)
    failed = pid * 0
    for p in range(P):
        base, cnt = _geometry(tl.load(sched + 3 * p), tl.load(sched + 3 * p + 1), tl.load(sched + 3 * p + 2), pid)
        acc = tl.zeros([BLOCK], tl.int32)
        for j in tl.static_range(PRE):      # weights need no sync: issued before the barrier
            acc += _tile(w, base, cnt, j * BLOCK, BLOCK)
        if SYNC:
            if p > 0:
                failed = _grid_barrier(bar, err, G, spin_limit, failed, p, POLL)
        dep = tl.load(outs + p * G + (pid + 1) % G)
        _finish(w, outs, base, cnt, acc, PRE * BLOCK, dep, p, pid, G, BLOCK)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", type=int, default=196, help="phases a repetition (default 7 x 28)")
    ap.add_argument("--bytes", default=DEFAULT_BYTES, help="bytes a phase, cycled (comma list, 0 allowed)")
    ap.add_argument("--programs-per-sm", type=int, default=1)
    ap.add_argument("--block", type=int, default=4096, help="int32 a load step of a program (power of 2)")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--pre", type=int, default=1, help="tiles loaded before the PDL wait / the barrier")
    ap.add_argument("--polls", default="one,all", help="barrier polls: one (one thread a program), all (every thread)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions captured in one graph")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--spin-limit", type=int, default=1 << 21, help="polls before a barrier waiter gives up")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.sizes = [float(x) for x in a.bytes.split(",") if x.strip()]
    a.poll_kinds = [x.strip() for x in a.polls.split(",") if x.strip()]
    if not a.sizes or min(a.sizes) < 0 or a.phases < 1 or a.programs_per_sm < 1 or a.pre < 0:
        ap.error("--bytes needs non-negative sizes; --phases, --programs-per-sm >= 1; --pre >= 0")
    if a.block < 16 or a.block & (a.block - 1) or set(a.poll_kinds) - set(POLLS):
        ap.error("--block: a power of 2 >= 16; --polls: one and/or all")
    return a


def schedule(phases: int, sizes, grid: int, align: int = 4096) -> tuple[list, int]:
    """[(offset, elements, elements a program)] int32 elements of each phase, phase p reading sizes[p % len]
    bytes rounded up to 64 (elements and each program's share multiples of 16: 16-byte loads, masks by
    4), at offsets aligned to `align` bytes, every byte of the buffer once; and the bytes laid out (aligned)."""
    out, pos = [], 0
    for p in range(phases):
        n = math.ceil(sizes[p % len(sizes)] / 64) * 16
        out.append((pos // 4, n, math.ceil(n / grid / 16) * 16))
        pos += math.ceil(n * 4 / align) * align
    return out, pos


def rotation(rep_bytes: int, min_bytes: float = MIN_ROTATION) -> int:
    """Copies of a repetition's layout the graph cycles through so that a byte is read again only after
    >= min_bytes of others (one copy when a repetition alone reads that much)."""
    return 1 if rep_bytes == 0 else max(1, math.ceil(min_bytes / rep_bytes))


def resident_programs(kern, props) -> int:
    """Programs of a compiled kernel one SM holds at once (threads, registers by warp in 256s, smem)."""
    nw = kern.metadata.num_warps
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * nw)
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (math.ceil(kern.n_regs * 32 / 256) * 256 * nw)
    smem = kern.metadata.shared + 1024                 # + the 1 KB a block the system reserves (sm_80+)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // smem
    return min(by_threads, by_regs, by_smem, 32)


def graph_us(fn, reps: int, replays: int, guard=lambda: None) -> float:
    for r in range(reps):                              # compile every specialization outside the capture
        fn(r)
    torch.cuda.synchronize()
    guard()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(reps):
            fn(r)
    g.replay()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(), g.replay(), b.record(), b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)


def reference(w, sched, G, outs0, base=0):
    """outs [P + 1, G] by torch: the same int32 slice sums, float32 rounding and order as the kernels."""
    rows = [outs0]
    for off, n, per in sched:
        sl = torch.zeros(G * per, dtype=torch.int32, device=w.device)
        sl[:n] = w[base + off:base + off + n]
        s = sl.view(G, per).sum(1, dtype=torch.int32).to(torch.float32)
        rows.append(s + 0.5 * torch.roll(rows[-1], -1))
    return torch.stack(rows)


def main(argv=None):
    a = parse_args(argv)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms, pps = props.multi_processor_count, a.programs_per_sm
    G, P = sms * pps, a.phases
    sched, lay = schedule(P, a.sizes, G)
    k = rotation(lay)
    reps = math.ceil(a.reps / k) * k                 # whole rotations: a replay starts on the copy read longest ago
    assert k * lay < 8e9, "the weight buffer's int32 offsets"
    rep_bytes = sum(n * 4 for _, n, _ in sched)
    w = torch.randint(0, 4, (max(k * lay // 4, 16),), dtype=torch.int32, device=dev)
    empty = [(0, 0, 0)] * P
    st = {"w": torch.tensor(sched, dtype=torch.int32, device=dev).flatten(),
          "e": torch.tensor(empty, dtype=torch.int32, device=dev).flatten()}
    outs = torch.empty((P + 1, G), dtype=torch.float32, device=dev)
    outs0 = torch.arange(G, device=dev, dtype=torch.float32) * 0.25
    bar = torch.zeros(2 * GEN.value, dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    kw = dict(BLOCK=a.block, num_warps=a.warps)

    # residency: a grid barrier with a program that cannot start until another ends never completes
    builds = [_persistent_kernel.warmup(w, outs, st["w"], bar, err, P, G, a.spin_limit, PRE=pre, SYNC=True,
                                        POLL=POLLS.index(pl), grid=(G,), **kw)
              for pre in sorted({0, a.pre}) for pl in a.poll_kinds]
    builds = [b.result() if hasattr(b, "result") else b for b in builds]
    [b._init_handles() for b in builds]
    fit = min(resident_programs(b, props) for b in builds)
    regs = max(b.n_regs for b in builds)
    assert G <= sms * pps
    if pps > fit:
        raise SystemExit(f"grid_sync_probe: {pps} programs an SM do not fit (the persistent kernel holds up to "
                         f"{regs} registers x {a.warps} warps: {fit} an SM); lower --programs-per-sm, --warps "
                         f"or --block")

    nc = min(64 << 20, w.numel())
    copy_src, copy_dst = w[:nc], torch.empty(nc, dtype=torch.int32, device=dev)
    t_copy = graph_us(lambda r: copy_dst.copy_(copy_src), reps, a.replays)
    copy_gbs = 2 * copy_src.numel() * 4 / t_copy / 1e3          # read + write bytes a second

    def chain(key, pdl):
        def fn(r, sc=sched if key == "w" else empty):
            base = (r % k) * lay // 4
            for p, (off, n, per) in enumerate(sc):
                _phase_kernel[(G,)](w, outs, p, base + off, n, per, G, PDL=pdl, PRE=a.pre if pdl else 0,
                                    **kw, **({"launch_pdl": True} if pdl else {}))
        return fn

    def persist(key, pre, sync, poll):
        def fn(r):
            wb = w[(r % k) * lay // 4:] if key == "w" else w
            _persistent_kernel[(G,)](wb, outs, st[key], bar, err, P, G, a.spin_limit, PRE=pre, SYNC=sync,
                                     POLL=poll, **kw)
        return fn

    variants = [("floor", "w", 1, persist("w", 0, False, 0)), ("chain", "w", P, chain("w", 0)),
                ("chain+pdl", "w", P, chain("w", 1))]
    for q in a.poll_kinds:
        variants += [(f"persist[{q}]", "w", 1, persist("w", 0, True, POLLS.index(q))),
                     (f"persist+pre[{q}]", "w", 1, persist("w", a.pre, True, POLLS.index(q)))]
    variants += [("empty chain", "e", P, chain("e", 0)), ("empty chain+pdl", "e", P, chain("e", 1))]
    variants += [(f"empty barrier[{q}]", "e", 1, persist("e", 0, True, POLLS.index(q))) for q in a.poll_kinds]

    refs = {"w": reference(w, sched, G, outs0, ((reps - 1) % k) * lay // 4),
            "e": reference(w, empty, G, outs0)}
    rows, t_floor = [], None
    for name, key, launches, fn in variants:
        outs.fill_(float("nan")), outs[0].copy_(outs0), bar.zero_(), err.zero_()

        def guard():
            if err.item():
                raise SystemExit(f"grid_sync_probe: {name}: a barrier waiter gave up (latest at phase "
                                 f"{err.item() - 1}) after {a.spin_limit} polls: the grid of {G} was not all resident")
        t = graph_us(fn, reps, a.replays, guard)
        guard()
        b = rep_bytes if key == "w" else 0
        ok = "racy" if name == "floor" else ("ok" if torch.equal(outs, refs[key]) else "MISMATCH")
        t_floor = t if name == "floor" else t_floor
        per_floor = (t - (t_floor if key == "w" else 0.0)) / P
        per_copy = (t - b / copy_gbs / 1e3) / P
        rows.append(dict(variant=name, launches=launches, us=t, gbs=b / t / 1e3, us_per_phase_vs_floor=per_floor,
                         us_per_phase_vs_copy=per_copy, check=ok))
    print(f"{props.name}: {sms} SMs, grid {G} ({pps}/SM, {a.warps} warps, persistent kernel <= {regs} regs, "
          f"{fit}/SM fit), {P} phases, {rep_bytes / 1e6:.1f} MB a repetition (x{k} rotation), "
          f"copy {copy_gbs:.0f} GB/s (torch, read + write)\n")
    print("| variant | launches/rep | us/rep | GB/s | us/phase over floor | us/phase over copy | check |\n|"
          + "---|" * 7)
    for r in rows:
        print(f"| {r['variant']} | {r['launches']} | {r['us']:.1f} | {r['gbs']:.0f} | "
              f"{r['us_per_phase_vs_floor']:.3f} | {r['us_per_phase_vs_copy']:.3f} | {r['check']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), device=props.name, sms=sms, grid=G, regs=regs, reps=reps, fit_per_sm=fit,
                           rep_bytes=rep_bytes, rotation=k, copy_gbs=copy_gbs, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
