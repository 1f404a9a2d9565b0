"""What a grid-wide barrier costs inside one persistent Triton kernel, against the launch boundary it would replace
(perf-log AU4 / CD1: a decode layer without launch boundaries needs ~5 grid barriers a layer where the engine now
has ~7 launches; AK3 measured a chained launch's floor at ~1.0-1.4 us).

The kernel: NPROG programs (k per SM, all resident), ROUNDS rounds; in each round every program arrives on one global
counter (an atomic add with release semantics) and spins until the counter reaches (round + 1) * NPROG, polling with
an acquire atomic (--poll atomic) or a relaxed load followed by an acquire fence (--poll load). --work: each program
stores a 2 KiB slice before the barrier and reads its neighbour's after it (the data a real phase hands over),
and the sums are checked on the host (a barrier that let a program through early shows as a wrong sum).
Timing: CUDA events around one launch of ROUNDS rounds minus one of 0 rounds, divided by ROUNDS; the reference is a
CUDA graph of ROUNDS launches of a one-store kernel on the same grid (no PDL).
    python tools/grid_barrier_probe.py [--rounds 2000] [--per-sm 1,2,4] [--warps 4]
A spin that gives up (its poll count past --max-spin: programs not all resident) is counted and printed."""
import argparse

import torch
import triton
import triton.language as tl

BLOCK = 512          # float32 values a program hands over in --work (2 KiB)


@triton.jit
def _acquire_fence():
    tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rounds_kernel(counter, data, out, gave_up, rounds, nprog, max_spin,
                   WORK: tl.constexpr, POLL_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for r in range(rounds):
        if WORK:      # this round's slice, small integers (exact float32 sums); a double buffer by round parity
            tl.store(data + ((r % 2) * nprog + pid) * BLOCK + offs, ((pid % 8) + (r % 5) * 16 + (offs % 4) * 128).to(tl.float32))
        # every thread's stores before the one thread's release (Triton issues a scalar atomic from thread 0 only
        # and broadcasts a scalar load's value through shared memory: seen in the sm_90 PTX)
        tl.debug_barrier()
        tl.atomic_add(counter, 1, sem="release", scope="gpu")
        target = (r + 1) * nprog
        if POLL_LOAD:
            c = tl.load(counter, volatile=True)
        else:
            c = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        spin = 0
        while (c < target) & (spin < max_spin):
            if POLL_LOAD:
                c = tl.load(counter, volatile=True)
            else:
                c = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
            spin += 1
        if POLL_LOAD:
            _acquire_fence()
        if spin >= max_spin:
            tl.atomic_add(gave_up, 1)
        if WORK:
            nb = (pid + 1) % nprog
            acc += tl.load(data + ((r % 2) * nprog + nb) * BLOCK + offs, volatile=True)
    tl.store(out + pid * BLOCK + offs, acc)


@triton.jit
def _one_store_kernel(out):
    tl.store(out + tl.program_id(0), 1.0)


def _time(fn, reps: int = 5) -> float:
    """Median milliseconds of fn() over reps, after one warm-up."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def barrier_us(nprog: int, rounds: int, warps: int, work: bool, poll_load: bool, max_spin: int) -> tuple[float, int, bool]:
    dev = "cuda"
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    gave_up = torch.zeros(1, dtype=torch.int32, device=dev)
    data = torch.zeros(2 * nprog * BLOCK, dtype=torch.float32, device=dev)
    out = torch.zeros(nprog * BLOCK, dtype=torch.float32, device=dev)

    def launch(n):
        counter.zero_()
        _rounds_kernel[(nprog,)](counter, data, out, gave_up, n, nprog, max_spin, WORK=work, POLL_LOAD=poll_load,
                                 BLOCK=BLOCK, num_warps=warps)
    ms_r, ms_0 = _time(lambda: launch(rounds)), _time(lambda: launch(0))
    # the arrivals (not the atomic polls, which add 0) must sum to rounds * nprog: one atomic a program, not a thread
    launch(rounds)
    torch.cuda.synchronize()
    ok = int(counter.item()) == rounds * nprog
    if work:
        # a neighbour's slice read before it was written this round holds round r - 2's (r % 5) term: off by 16s
        nb = (torch.arange(nprog, device=dev, dtype=torch.float64) + 1) % nprog
        r5 = (torch.arange(rounds, dtype=torch.float64, device=dev) % 5).sum() * 16
        offs = torch.arange(BLOCK, dtype=torch.float64, device=dev) % 4 * 128
        want = rounds * (nb[:, None] % 8) + r5 + rounds * offs[None, :]
        ok = ok and torch.equal(out.view(nprog, BLOCK).double(), want)
    return (ms_r - ms_0) * 1000 / rounds, int(gave_up.item()), ok


def graph_launch_us(nprog: int, rounds: int, warps: int) -> float:
    out = torch.zeros(nprog, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _one_store_kernel[(nprog,)](out, num_warps=warps)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(rounds):
            _one_store_kernel[(nprog,)](out, num_warps=warps)
    return _time(g.replay) * 1000 / rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--per-sm", default="1,2,4", help="programs an SM (comma-separated)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--max-spin", type=int, default=2_000_000)
    a = ap.parse_args()
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}: {n_sm} SMs, {a.warps} warps a program, {a.rounds} rounds")
    print("| programs | poll | work | us a barrier | gave up | checked | graph launch us |")
    print("|---:|---|---|---:|---:|---|---:|")
    for k in (int(x) for x in a.per_sm.split(",")):
        nprog = k * n_sm
        g = graph_launch_us(nprog, a.rounds, a.warps)
        for poll_load in (False, True):
            for work in (False, True):
                us, gave, ok = barrier_us(nprog, a.rounds, a.warps, work, poll_load, a.max_spin)
                print(f"| {nprog} | {'load' if poll_load else 'atomic'} | {'2 KiB' if work else '-'} | {us:.3f} | "
                      f"{gave} | {'ok' if ok else 'WRONG'} | {g:.3f} |", flush=True)


if __name__ == "__main__":
    main()
