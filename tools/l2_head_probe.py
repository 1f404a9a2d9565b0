"""Does a big decode GEMV run faster when the head blocks of every row tile are already in L2?
(issue 12, perf-log AN3; on the GPU)

    python tools/l2_head_probe.py [--heads 0,2,4,6] [--sleep-us 10]

The idea under test: between q/k/v's end and gate+up's release (the attention, o, the hand-offs:
~10 us a layer) the HBM is nearly idle. If gate+up (76 MB, tile-major: each program reads one
contiguous run per plane) is bound by HBM, fetching the first h of its 14 K blocks of every tile
into L2 in that window shortens every program, so the kernel, by up to h / 14. Fetching whole tiles
(what l2_prefetch.L2Plan's "head rows" did, perf-log T1) shortens only some programs, not the kernel.

Per shape (gate+up Q4_K 37888x3584, down Q4_K 3584x18944; the shipped Gluon config, tile-major, in
rotating copies so nothing else is in L2), per h: each call is a bulk L2 prefetch
(`cp.async.bulk.prefetch.L2.global`, one per tile and plane, from a Triton kernel) of the first h blocks
of every tile of the copy about to be read, a sleep kernel (the window), then the GEMV without PDL
(so its programs start after the sleep). The GEMV kernel's own time is CUPTI's start-to-end stamps
(torch.profiler), median over the calls; h = 0 is the same sequence without the prefetch. The outputs
are checked equal to the h = 0 call's (the prefetch changes no bits)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _heads(addr, tile_bytes, head_bytes):
    """Program t: the first head_bytes of tile t (at addr + t * tile_bytes) into L2, from lane 0."""
    t = tl.program_id(0)
    lane = tl.arange(0, 32)
    go = (lane == 0).to(tl.int32)
    a = addr + t.to(tl.int64) * tile_bytes + lane.to(tl.int64) * 0
    n = (head_bytes + lane * 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, 0; @p cp.async.bulk.prefetch.L2.global [$2], $3; mov.u32 $0, 0; }",
        "=r,r,l,r", [go, a, n], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_heads(rw, h: int) -> int:
    """Bulk-prefetch blocks [0, h) of every tile of a tile-major Repacked's planes (the ranges the
    engine's L2 heads prefetch takes: l2_prefetch.tile_heads); the bytes asked."""
    from minfer.ops.cuda.l2_prefetch import tile_heads

    r = tile_heads(rw, h)
    if r is None:
        return 0
    for addr, run, head in r[1:]:
        _heads[(r[0],)](addr, run, head, num_warps=1)
    return r[0] * sum(head for _, _, head in r[1:])


def _durations(prof, *names: str) -> list[list[float]]:
    """Per name, the GPU durations (us) of the recorded kernels whose name holds it."""
    from gemv_table import trace_kernels

    ks = trace_kernels(prof)
    return [[float(e["dur"]) for e in ks if name in e["name"]] for name in names]


def main(argv=None) -> int:
    from minfer.bench.gemv_q8_sweep import _copies
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack_layout import to_tiles
    from minfer.ops.cuda.plane_layout import tile_rows_for
    from minfer.ops.cuda.qmatmul import _q8_kw
    from minfer.switches import Switches
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="0,2,4,6", help="head blocks a tile to prefetch (gate+up: of 14)")
    ap.add_argument("--down-heads", default="0,10,20,30", help="the same for the down (of 74)")
    ap.add_argument("--sleep-us", type=float, default=10.0, help="the window between the prefetch and the GEMV")
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    sw = Switches.from_env()
    probe = torch.empty(1, device="cuda")
    kw = _q8_kw(sw, probe)
    kw.pop("l2", None)
    kw["pdl"] = 0                                     # the GEMV starts after the sleep, not during it
    gen = torch.Generator(device="cuda").manual_seed(0)
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_980_000     # (H200: 1.98 GHz)
    cycles = int(a.sleep_us * 1e-6 * khz * 1e3)
    rows = []
    print(f"{torch.cuda.get_device_name()}; sleep {a.sleep_us} us ({cycles} cycles); launch {kw}")
    for label, qt, n, k, heads in (("gate+up", 12, 37888, 3584, a.heads), ("down Q4_K", 12, 3584, 18944, a.down_heads)):
        tr = tile_rows_for(qt, n, k, sw.gemv_q8g_table)
        if not tr:
            print(f"{label}: not tile-major in the shipped table; skipped")
            continue
        rws, plane_bytes, copies = _copies([(qt, n)], k, gen)
        rws = [to_tiles(r, tr) for r in rws]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        q8 = Q.quantize(x)
        ws = G.GemvWorkspace("cuda")
        ref = Q.gemv_q8(q8, rws[0], ws=ws, out_dtype=torch.float32, **kw).clone()
        for h in (int(v) for v in heads.split(",")):
            def call(i, h=h):
                if h:
                    prefetch_heads(rws[i % copies], h)
                torch.cuda._sleep(cycles)
                return Q.gemv_q8(q8, rws[i % copies], ws=ws, out_dtype=torch.float32, **kw)
            for i in range(3):
                call(i)
            same = torch.equal(call(0), ref)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(a.calls):
                    call(i)
                torch.cuda.synchronize()
            ds, pf = _durations(prof, "gemv_q8g", "_heads")
            asked = prefetch_heads(rws[0], h) if h else 0
            torch.cuda.synchronize()
            us = statistics.median(ds) if ds else float("nan")
            r = {"shape": label, "n": n, "k": k, "tile_rows": tr, "heads": h, "blocks": k // 256,
                 "prefetched_mb": asked / 1e6, "plane_mb": plane_bytes / 1e6, "gemv_us": us, "gemv_calls": len(ds),
                 "prefetch_kernel_us": statistics.median(pf) if pf else 0.0, "same_bits": same}
            rows.append(r)
            print(f"{label:9s} heads {h:2d}/{k // 256}: {asked / 1e6:6.1f} MB prefetched; GEMV {us:7.2f} us alone "
                  f"({len(ds)} calls), {plane_bytes / us / 1e3:5.0f} GB/s of planes; same bits {same}", flush=True)
        del rws
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "sleep_us": a.sleep_us, "rows": rows}, f, indent=1)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
