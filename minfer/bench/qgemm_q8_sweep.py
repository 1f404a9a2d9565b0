"""Config sweep of the int8 tensor-core batched-decode GEMM (ops/cuda/qgemm_q8.py) against cuBLAS
on a dense bf16 copy of the same weight, in the same run.

    python -m minfer.bench.qgemm_q8_sweep [--m 16,32,64,128] [--out PATH.json] [--json ROWS.json]
    TRITON_INTERPRET=1 python -m minfer.bench.qgemm_q8_sweep --tiny     (CPU check of this script)

Shapes: the Qwen2.5-7B Q4_K_M linears (qkv as one weight, o, gate+up as one weight, down in
Q4_K and Q6_K, a Q6_K attn_v). Weights: random valid blocks repacked on the GPU, a rotating set
of copies (>= 192 MB, the L2 holds 60 MB) for the kernel and for cuBLAS, so that no call finds
its weight in L2. Activations: random bf16 rows and their q8 form (gemv_q8.quantize_rows, timed
on its own: in the engine it is either made by the producer or one extra launch per input).
Timing: gemv_sweep.graph_time (a CUDA graph of R calls walking the copies, median replay / R).
Each config's output is first checked once against a float32 torch reference (x_hat @ W^T,
x_hat the q8 rows' values, W gemv_repack.dequantize_into's exact decode): max |err| / max |ref|;
above 1e-3 it is reported WRONG and not timed. Rates: plane bytes per second, and the ratio to
cuBLAS (F.linear on the bf16 copy). Kernel variants are compiled first in worker processes
(each runs every config once on a 256-row weight of the same K and M: the same Triton
specialization, so the main process finds them in Triton's cache).
Prints a table and the best config per shape and M bucket in qgemm_q8_h200.json's format
(--out writes it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False     # the float32 reference is a float32 matmul

Q4_K, Q6_K = 12, 14
NAME = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
SHAPES = [                                    # (label, type, N, K)
    ("qkv", Q4_K, 4608, 3584),
    ("o", Q4_K, 3584, 3584),
    ("gate_up", Q4_K, 37888, 3584),
    ("down", Q4_K, 3584, 18944),
    ("down", Q6_K, 3584, 18944),
    ("v", Q6_K, 512, 3584),
]
TINY = [("tiny", Q4_K, 96, 512), ("tiny", Q6_K, 64, 512)]
# per M bucket: (BN, BM, CB, num_warps, num_stages), best guesses first; SPLIT from a program
# target. From sm_90 builds on the CPU (ptxas, no GPU run): SASS instructions per value in the
# loop, per thread, in this order -- Q4_K M=16: 4.8 / 5.7 / 5.9 / 6.0; M=32: 7.0 / 7.7 / 8.0 /
# 8.5; M=64: 13.3 (BM=64) or 2 x 7.0 (two M tiles of 32); BM=128: 27 and spills. Q6_K ~2x
# (two dots and two rescales per chunk): 9.6 at M=16, 13.2 at 32, 22.5 at 64.
CANDIDATES = {
    16: [(128, 16, 8, 4, 4), (256, 16, 4, 8, 3), (128, 16, 4, 4, 3), (64, 16, 8, 4, 3)],
    32: [(128, 32, 8, 4, 3), (256, 32, 4, 8, 3), (128, 32, 4, 4, 3), (128, 32, 8, 8, 3)],
    64: [(128, 64, 8, 8, 3), (128, 32, 8, 4, 3), (128, 64, 4, 8, 3)],
    128: [(128, 64, 8, 8, 3), (128, 32, 8, 4, 3), (64, 128, 8, 8, 3)],
    256: [(128, 64, 8, 8, 3), (128, 32, 8, 4, 3), (64, 128, 8, 8, 3)],
}
TARGETS = (264, 528)                          # programs wanted before K is split
MAX_REL = 1e-3


def _mods():
    """(qgemm_q8, gemv_q8, gemv_repack, gemv_sweep), looked up when called (so that a test's
    interpreter-loaded modules are the ones used)."""
    from minfer.bench import gemv_sweep
    from minfer.ops.cuda import gemv_q8, gemv_repack, qgemm_q8
    return qgemm_q8, gemv_q8, gemv_repack, gemv_sweep


def plan(shapes, ms, tiny: bool) -> list:
    """[(label, qt, n, k, m, config)] of every run."""
    Q = _mods()[0]
    runs = []
    for label, qt, n, k in shapes:
        for m in ms:
            cands = [(32, 16, 8, 4, 1)] if tiny else CANDIDATES[Q.m_bucket(m)]
            seen = set()
            for i, (bn, bm, cb, w, st) in enumerate(cands):
                for t in (TARGETS[:1] if tiny else TARGETS):
                    cfg = (bn, bm, cb, Q.split_for(m, n, k, bn, bm, cb, target=t), w, st)
                    # the first candidate also with the weight bytes built one by one (asm 0): a
                    # working baseline should the PTX byte packing misbehave on a device
                    for c in ((cfg, cfg + (0,)) if i == 0 and t == TARGETS[0] and not tiny else (cfg,)):
                        if c not in seen:
                            seen.add(c)
                            runs.append((label, qt, n, k, m, c))
    return runs


def _compile_worker(jobs) -> list:
    """Runs each (qt, k, m, config) once on a 256-row weight: compiles it into Triton's cache."""
    Q, Q8, G, GS = _mods()
    gen = torch.Generator(device="cuda").manual_seed(1)
    errs, cache = [], {}
    for qt, k, m, cfg in jobs:
        try:
            if (qt, k) not in cache:
                cache[qt, k] = G.repack(GS.random_raw(qt, 256, k, gen, "cuda"), qt, 256, k)
            q8 = Q8.quantize_rows(torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16))
            Q.qgemm_q8(q8, cache[qt, k], config=cfg, ws=G.GemvWorkspace("cuda"))
        except Exception as e:                   # reported by the main process when it runs the config
            errs.append(f"{NAME[qt]} k{k} m{m} {cfg}: {type(e).__name__}: {str(e)[:200]}")
    torch.cuda.synchronize()
    return errs


def precompile(runs, jobs: int) -> float:
    t = time.time()
    todo = sorted({(qt, k, m, cfg) for _, qt, n, k, m, cfg in runs})
    if jobs <= 1 or len(todo) < 4:
        return 0.0
    try:
        with mp.get_context("spawn").Pool(jobs) as pool:
            for errs in pool.map(_compile_worker, [todo[i::jobs] for i in range(jobs)]):
                for e in errs:
                    print(f"  precompile: {e}", flush=True)
    except Exception as e:                       # the main process compiles what is missing
        print(f"  precompile failed ({type(e).__name__}: {e}); compiling in the run", flush=True)
    return time.time() - t


def sweep(shapes, ms, dev: str, calls: int = 24, jobs: int = 1, rows_out=None) -> dict:
    """Runs the plan; returns {"rows", "best", "configs", ...}. dev "cpu": Triton's interpreter
    (TRITON_INTERPRET=1 set before the kernel modules were imported), one call timed by the clock."""
    Q, Q8, G, GS = _mods()
    tiny = dev == "cpu"
    interp = tiny
    runs = plan(shapes, ms, tiny)
    tc = precompile(runs, jobs) if not tiny else 0.0
    print(f"{len(runs)} runs, {len({(r[1], r[3], r[4], r[5]) for r in runs})} kernel variants, "
          f"precompiled in {tc:.1f} s", flush=True)

    def timed(fns):
        if tiny:
            t = time.perf_counter()
            fns[0]()
            return time.perf_counter() - t
        return GS.graph_time(fns)

    gen = torch.Generator(device=dev).manual_seed(0)
    ws = G.GemvWorkspace(dev)
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)", "torch": torch.__version__,
           "rows": [], "best": {}, "configs": {}}
    by_shape: dict = {}
    for r in runs:
        by_shape.setdefault(r[:4], []).append(r)
    for (label, qt, n, k), rs in by_shape.items():
        rw0 = G.repack(GS.random_raw(qt, n, k, gen, dev), qt, n, k)
        pbytes = rw0.nbytes()
        copies = 1 if tiny else max(2, min(128, -(-192_000_000 // pbytes)))
        rws = [rw0] + [G.repack(GS.random_raw(qt, n, k, gen, dev), qt, n, k) for _ in range(copies - 1)]
        dense32 = torch.empty((n, k), dtype=torch.float32, device=dev)
        G.dequantize_into(rw0, dense32, interpret=interp)
        dcopies = 1 if tiny else max(2, -(-192_000_000 // (2 * n * k)))
        denses = [dense32.to(torch.bfloat16) for _ in range(dcopies)]
        ncall = max(calls, copies, dcopies) if not tiny else 1
        for m in ms:
            mrs = [r for r in rs if r[4] == m]
            if not mrs:
                continue
            x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
            q8 = Q8.quantize_rows(x, interpret=interp)
            xh = Q8.dequantize_q8(q8, m * k).view(m, k)
            ref = xh @ dense32.t()
            # (each lambda is called before the next iteration: defaults bind the values anyway)
            t_cub = timed([lambda x=x, d=denses[i % dcopies]: F.linear(x, d) for i in range(ncall)])
            t_q = timed([lambda x=x: Q8.quantize_rows(x, interpret=interp)] * (1 if tiny else calls))
            best = None
            for *_, cfg in mrs:
                try:
                    out = Q.qgemm_q8(q8, rw0, out_dtype=torch.float32, config=cfg, ws=ws, interpret=interp)
                    err = float((out - ref).abs().max() / ref.abs().max())
                    if not err <= MAX_REL:
                        print(f"  WRONG {label} {NAME[qt]} m{m} {cfg}: max rel err {err:.3g}", flush=True)
                        continue
                    t = timed([lambda q8=q8, rw=rws[i % copies], cfg=cfg: Q.qgemm_q8(q8, rw, config=cfg, ws=ws,
                                                                                    interpret=interp)
                               for i in range(ncall)])
                except Exception as e:
                    print(f"  {label} {NAME[qt]} m{m} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                row = {"shape": label, "type": NAME[qt], "n": n, "k": k, "m": m, "config": list(cfg), "us": t * 1e6,
                       "gb_s": pbytes / t / 1e9, "cublas_us": t_cub * 1e6, "x_cublas": t_cub / t,
                       "quantize_us": t_q * 1e6, "max_rel_err": err}
                res["rows"].append(row)
                if best is None or t * 1e6 < best["us"]:
                    best = row
            if best is None:
                continue
            port = [r["us"] for r in res["rows"] if r["shape"] == label and r["type"] == NAME[qt] and r["m"] == m
                    and len(r["config"]) == 7]
            key = f"{NAME[qt]} {n}x{k} m{Q.m_bucket(m)}"
            res["best"][key] = best
            res["configs"][key] = best["config"]
            print(f"{label:8s} {NAME[qt]} {n:6d}x{k:<5d} M={m:3d} | cuBLAS bf16 {t_cub * 1e6:7.1f} us "
                  f"{2 * n * k / t_cub / 1e9:5.0f} GB/s | q8 {best['us']:7.1f} us {best['gb_s']:5.0f} GB/s "
                  f"x{best['x_cublas']:4.2f} | no-PTX-packing {port[0] if port else float('nan'):7.1f} us | "
                  f"quantize {t_q * 1e6:5.1f} us | err {best['max_rel_err']:.1e} "
                  f"{best['config']}", flush=True)
            if rows_out:
                with open(rows_out, "w") as f:
                    json.dump(res, f, indent=1)
        rws = denses = dense32 = rw0 = None         # freed before the next shape's copies
        if dev == "cuda":
            torch.cuda.empty_cache()
    return res


def table(res: dict) -> dict:
    return {"about": "H200 configs of minfer.ops.cuda.qgemm_q8: '<type> <N>x<K> m<bucket>' -> "
                     "[BN, BM, CB, SPLIT, num_warps, num_stages(, 0: no PTX byte packing)], from python -m "
                     "minfer.bench.qgemm_q8_sweep "
                     f"({res['gpu']}, {time.strftime('%Y-%m-%d')})",
            "measured": {k: f"{v['gb_s']:.0f} GB/s, {v['us']:.1f} us, x{v['x_cublas']:.2f} cuBLAS bf16 "
                            f"({v['cublas_us']:.1f} us)" for k, v in res["best"].items()},
            "configs": res["configs"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,32,64,128", help="batch rows, comma list")
    ap.add_argument("--out", default=None, help="write the best-config table (qgemm_q8_h200.json format)")
    ap.add_argument("--json", default=None, help="write every measured row")
    ap.add_argument("--shapes", default="", help="comma list of shape labels (default: all)")
    ap.add_argument("--calls", type=int, default=24, help="calls per CUDA graph")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (default min(16, CPUs))")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU check of this script (Triton's interpreter: set TRITON_INTERPRET=1), tiny shapes")
    args = ap.parse_args(argv)
    t0 = time.time()
    ms = tuple(int(v) for v in args.m.split(","))
    want = set(args.shapes.split(",")) if args.shapes else None
    shapes = TINY if args.tiny else [s for s in SHAPES if not want or s[0] in want]
    if args.tiny:
        ms = tuple(m for m in ms if m <= 32)[:1] or (16,)
    jobs = 1 if args.tiny else args.jobs if args.jobs is not None else min(16, os.cpu_count() or 1)
    res = sweep(shapes, ms, "cpu" if args.tiny else "cuda", calls=args.calls, jobs=jobs, rows_out=args.json)
    res["wall_s"] = time.time() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    tot_c = sum(v["cublas_us"] for v in res["best"].values())
    tot_q = sum(v["us"] for v in res["best"].values())
    if tot_q:
        print(f"sum over shapes and M: cuBLAS {tot_c:.0f} us, q8 GEMM {tot_q:.0f} us (x{tot_c / tot_q:.2f}); "
              f"wall {res['wall_s']:.0f} s")
    tab = table(res)
    print(json.dumps(tab, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(tab, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
