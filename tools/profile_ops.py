"""Per-op breakdown of one prefill and one decode step on CUDA, plus the launch-path counts.

    python tools/profile_ops.py MODEL.gguf [--prompt 3354] [--json OUT.json]

Kernel times come from torch.profiler (CUDA activity), grouped by kernel name; the decode
step is profiled eagerly (MINFER_CUDA_GRAPH=0) so that each kernel shows, and also timed as
a graph replay. Path counts are those of exactly one prefill (minfer.ops.paths, reset first).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

import torch


def top_kernels(prof, n=18):
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name if len(e.name) < 90 else e.name[:87] + "..."
            agg[name][0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            agg[name][1] += 1
    total = sum(v[0] for v in agg.values())
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])[:n]
    return total / 1e3, [(k, v[0] / 1e3, v[1], v[0] / total if total else 0) for k, v in rows]


def show(title, total_ms, rows):
    print(f"\n== {title}: {total_ms:.2f} ms of GPU kernel time ==")
    print(f"{'ms':>8} {'share':>6} {'calls':>6}  kernel")
    for name, ms, calls, share in rows:
        print(f"{ms:8.3f} {share*100:5.1f}% {calls:6d}  {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=3354)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    eng = Engine.load(args.model, device="cuda", ctx=args.prompt + 64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, eng.config.vocab, (args.prompt,), generator=g).tolist()
    eng.reset(); eng.prefill(ids)                       # warm-up: compile, allocate
    torch.cuda.synchronize()
    paths.reset()
    eng.reset(); t0 = time.perf_counter(); eng.prefill(ids); torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    counts = paths.snapshot()
    print(f"one prefill of {args.prompt} tokens: {wall*1e3:.1f} ms wall ({args.prompt/wall:,.0f} tok/s)")
    print("launch paths of that one prefill:")
    for k, v in sorted(counts["counts"].items()):
        print(f"  {k}: {v}")
    for k, v in counts.get("switched_off", {}).items():
        print(f"  switched off: {k}: {v}")
    for k, v in counts.get("fallbacks", {}).items():
        print(f"  FELL BACK: {k}: {v}")

    from torch.profiler import ProfilerActivity, profile

    eng.reset()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.prefill(ids)
        torch.cuda.synchronize()
    pf_total, pf_rows = top_kernels(prof)
    show(f"prefill {args.prompt}", pf_total, pf_rows)

    os.environ["MINFER_CUDA_GRAPH"] = "0"
    pos = len(eng.tokens)
    eng.forward([1], pos)                                # warm the eager decode kernels
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.forward([2], pos + 1)
        torch.cuda.synchronize()
    dc_total, dc_rows = top_kernels(prof)
    show("decode step (eager)", dc_total, dc_rows)
    os.environ["MINFER_CUDA_GRAPH"] = "1"
    eng.forward([3], pos + 2)                            # capture
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(20):
        eng.forward([4], pos + 3 + i)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / 20 * 1e3
    print(f"\ndecode step as a CUDA graph replay (incl. logits to host): {step_ms:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prefill_tokens": args.prompt, "prefill_wall_ms": wall * 1e3, "paths": counts,
                       "prefill_kernels_ms": pf_total, "prefill_top": pf_rows,
                       "decode_eager_kernels_ms": dc_total, "decode_top": dc_rows,
                       "decode_graph_step_ms": step_ms, "memory_report": getattr(eng, "memory_report", None)},
                      f, indent=1)


if __name__ == "__main__":
    main()
