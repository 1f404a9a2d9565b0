"""What generate()'s token choice costs on the GPU (runtime/device_draw.DeviceDraw), per sampling
mode, with the fused draw (ops/cuda/draw.py) and the torch one, on (1, 152064) float32 logits (the 7B's vocabulary): the kernels of one draw under
torch.profiler (count, summed GPU time, the span from the first kernel's start to the last one's
end), and the wall time of a draw with its read-back, median of 200.

    python tools/draw_prof.py [--vocab 152064]        (on the GPU)
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
    a = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
