"""What generate()'s token choice costs on the GPU (runtime/device_draw.DeviceDraw), per sampling
mode, with the fused draw (ops/cuda/draw.py) and the torch one, on (1, 152064) float32 logits (the 7B's vocabulary): the kernels of one draw under
torch.profiler (count, summed GPU time, the span from the first kernel's start to the last one's
end), and the wall time of a draw with its read-back, median of 200.

    python tools/draw_prof.py [--vocab 152064]        (on the GPU)

--variants instead times the fused draw's kernels alone (ops/cuda/draw.FusedDraw, no read-back) for
default sampling (top_k 40) and top_k 128 at several sampled chunk sizes, merge sizes and warps:
busy GPU us a draw, each kernel's share, and how many of 50 random rows draw another token than
the default sizes do (must be 0: the merge is exact).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    from minfer.runtime.device_draw import DeviceDraw
    from minfer.runtime.sampling import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--variants", action="store_true", help="time FusedDraw's chunk / merge sizes and warps")
    a = ap.parse_args(argv)
    if a.variants:
        return variants(a.vocab)
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(1, a.vocab, device="cuda", generator=gen) * 3
    hist = list(range(100, 164))
    modes = [("greedy", SamplingParams(temperature=0)), ("default sampling", SamplingParams(seed=1)),
             ("top_k 0 (whole vocabulary)", SamplingParams(seed=1, top_k=0))]
    print(f"{torch.cuda.get_device_name()}, vocab {a.vocab}")
    for (name, p), fused in [(m, f) for m in modes for f in (False, True)]:
        name = f"{name}, {'fused draw' if fused else 'torch draw'}"
        d = DeviceDraw(p, fused=fused)
        for _ in range(20):
            d(logits, hist)
        torch.cuda.synchronize()
        walls = []
        for _ in range(200):
            t0 = time.perf_counter()
            d(logits, hist)
            walls.append(time.perf_counter() - t0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                d(logits, hist)
                torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ev.sort(key=lambda e: e.time_range.start)
        per = len(ev) // 5
        one = ev[-per:] if per else []
        busy = sum(e.time_range.elapsed_us() for e in one)
        span = (one[-1].time_range.end - one[0].time_range.start) if one else 0
        print(f"\n{name}: wall {statistics.median(walls) * 1e6:.1f} us a draw (median of 200, read-back included); "
              f"{per} GPU events a draw, busy {busy:.1f} us, span {span:.1f} us")
        by = {}
        for e in one:
            k = e.name[:70]
            c, t = by.get(k, (0, 0.0))
            by[k] = (c + 1, t + e.time_range.elapsed_us())
        for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:14]:
            print(f"  {c:3d} x {k:70s} {t:7.1f} us")
    return 0


# (sampled chunk size, merge keys (0: no merge), chunk kernel warps, merge kernel warps)
VARIANTS = [(4096, 0, 8, 8), (2048, 1024, 8, 8), (1024, 1024, 8, 8), (1024, 2048, 8, 8), (512, 1024, 8, 8),
            (512, 2048, 8, 8), (1024, 1024, 4, 8), (1024, 1024, 8, 4), (1024, 1024, 4, 4)]


def _busy(fd, x, keys, n: int = 50) -> dict:
    """GPU us a draw per kernel name over n draws (after a warm-up), under torch.profiler."""
    for _ in range(10):
        fd(x, *keys)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fd(x, *keys)
        torch.cuda.synchronize()
    by = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name] = by.get(e.name, 0.0) + e.time_range.elapsed_us() / n
    return by


def variants(vocab: int) -> int:
    from minfer.ops.cuda import draw
    from minfer.runtime.batch_sampling import _row_keys, draw_seed
    from minfer.runtime.sampling import SamplingParams

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for i in range(50):
        x = torch.randn(vocab, device="cuda", generator=gen) * (1 + i % 4)
        if i % 3 == 1:
            x[::7] = x[2].clone()              # ties, broken by id
        rows.append(x)
    print(f"{torch.cuda.get_device_name()}, vocab {vocab}; the fused draw's kernels alone (default sizes: chunk "
          f"{draw.SAMPLED_CH}, merge {draw.MERGE_KEYS}, warps {draw.CHUNK_WARPS}/{draw.MERGE_WARPS})")
    modes = (("default sampling (top_k 40)", SamplingParams(seed=1)), ("top_k 128", SamplingParams(seed=1, top_k=128)))
    for name, p in modes:
        seed = draw_seed(p.seed)
        base = draw.FusedDraw(p, "cuda")
        want = [int(base(x, *_row_keys(seed, i))[1][0]) for i, x in enumerate(rows)]
        print(f"\n{name}:")
        for ch, mk, cw, mw in VARIANTS:
            fd = draw.FusedDraw(p, "cuda", ch=ch, merge_keys=mk)
            fd.chunk_warps, fd.merge_warps = cw, mw
            miss = sum(int(fd(x, *_row_keys(seed, i))[1][0]) != want[i] for i, x in enumerate(rows))
            by = _busy(fd, rows[0], _row_keys(seed, 0))
            parts = ", ".join(f"{k.strip('_').split('_')[0]} {t:.1f}" for k, t in sorted(by.items()))
            merges = fd.p2 if fd.merge else 0
            print(f"  chunk {ch:4d} ({fd.p:3d} programs), merge {mk:4d} ({merges:2d} programs), warps {cw}/{mw}: "
                  f"busy {sum(by.values()):6.1f} us a draw ({parts}); final sorts "
                  f"{max(16, draw._pow2(fd.p2 * fd.kb))} keys; tokens unlike the default's: {miss}/50")
    return 0


if __name__ == "__main__":
    sys.exit(main())
