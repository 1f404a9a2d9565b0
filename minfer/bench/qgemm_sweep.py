"""Config sweep of the batched-decode GEMM over repacked planes (ops/cuda/qgemm_repack.py) against
cuBLAS on the dense bf16 weight, in the same run.

    python3 minfer/bench/qgemm_sweep.py --json OUT.json [--quick] [--write-configs | --configs-out PATH]
    (the script form imports no minfer package code besides the kernel files it loads by path,
    as gemv_sweep.py does, so a half-done edit elsewhere cannot break it)

Shapes: the Qwen2.5-7B Q4_K_M linears (qkv as one weight, o, gate+up as one weight, gate, down in
Q4_K and Q6_K, the lm head) at M = 16, 32, 64, 128, 256 rows of bf16 activations. Weights: random
valid blocks repacked on the GPU; the dense bf16 weight is their exact decode (gemv_repack's
dequantize_into), so both sides multiply the same bf16 values and each config's output is
checked against cuBLAS's. Timing: triton.testing.do_bench (L2 cleared before every call, so a
weight is read from HBM each time, as in a decode step), median. Rates: weight bytes per second
(planes for the kernel, 2 bytes per value for cuBLAS) and TFLOP/s (2 M N K).
Compiling ~60 kernel variants one by one takes longer than the timing, so worker processes
compile them first (each runs every config once on a small weight with the same K, M and split:
the same Triton specialization, so the main process finds them in Triton's cache).
The best config per shape and M bucket is printed (and with --write-configs written) in
ops/cuda/qgemm_repack_h200.json's format.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Q4_K, Q6_K = 12, 14
NAME = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
SHAPES = [                                   # (label, type, N, K)
    ("qkv", Q4_K, 4608, 3584),
    ("o", Q4_K, 3584, 3584),
    ("gate_up", Q4_K, 37888, 3584),
    ("gate", Q4_K, 18944, 3584),
    ("down", Q4_K, 3584, 18944),
    ("down", Q6_K, 3584, 18944),
    ("lm_head", Q6_K, 152064, 3584),
]
MS = (16, 32, 64, 128, 256)
# per M bucket: (BN, BM, BK, num_warps, num_stages); SPLIT comes from a program-count target
CANDIDATES = {      # best guesses first (--quick takes two): sm_90 builds without spills (see default_config)
    16: [(128, 16, 128, 4, 4), (64, 16, 256, 4, 4), (128, 16, 256, 8, 3), (64, 16, 512, 4, 3)],
    32: [(128, 32, 256, 8, 3), (64, 32, 256, 4, 4), (256, 32, 128, 8, 3), (64, 32, 128, 4, 4)],
    64: [(128, 64, 128, 8, 4), (256, 64, 128, 8, 3), (64, 64, 256, 4, 3), (128, 64, 256, 8, 3)],
    128: [(128, 128, 128, 8, 3), (256, 64, 128, 8, 3), (64, 128, 128, 4, 3), (256, 128, 128, 8, 2)],
    256: [(128, 256, 128, 8, 2), (128, 128, 128, 8, 3), (256, 128, 128, 8, 2), (64, 256, 128, 8, 2)],
}
TARGETS = (264, 528, 132)                    # programs wanted before K is split
DEV = "cuda"                                 # --smoke: "cpu" (Triton's interpreter) and tiny shapes


def _gemv_sweep():
    """The sibling script gemv_sweep.py, loaded by path: its module loader and random blocks."""
    name = "minfer_bench_gemv_sweep"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "minfer", "bench", "gemv_sweep.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _load(modname: str, relpath: str):
    return _gemv_sweep()._load(modname, relpath)


def kernels():
    """(qgemm_repack, gemv_repack) modules, loaded by path."""
    _load("minfer.errors", "minfer/errors.py")
    _load("minfer.ops.cuda.gemv_repack_layout", "minfer/ops/cuda/gemv_repack_layout.py")
    gr = _load("minfer.ops.cuda.gemv_repack", "minfer/ops/cuda/gemv_repack.py")
    qg = _load("minfer.ops.cuda.qgemm_repack", "minfer/ops/cuda/qgemm_repack.py")
    return qg, gr


def random_raw(qt: int, n: int, k: int, gen) -> torch.Tensor:
    """uint8 (n, row bytes) random Q4_K / Q6_K blocks on DEV (gemv_sweep.random_raw)."""
    return _gemv_sweep().random_raw(qt, n, k, gen, DEV)


def plan(quick: bool) -> list:
    """[(label, qt, n, k, m, config)] of every run; quick: two tiles per bucket, one split target."""
    qg, _ = kernels()
    runs = []
    for label, qt, n, k in SHAPES:
        if quick and label == "gate":
            continue
        for m in MS:
            cands = CANDIDATES[m][:2] if quick else CANDIDATES[m]
            targets = TARGETS[:1] if quick else TARGETS
            seen = set()
            for bn, bm, bk, w, st in cands:
                for t in targets:
                    split = qg.split_for(qt, m, n, k, bn, bm, bk, target=t)
                    cfg = (bn, bm, bk, split, w, st)
                    if cfg not in seen:
                        seen.add(cfg)
                        runs.append((label, qt, n, k, m, cfg))
    return runs


def _compile_worker(arg) -> list:
    """(device, [(qt, k, m, config)]): runs each config once on a 256-row weight, which compiles
    it into Triton's cache (a spawned process: the device comes along, --smoke runs on the CPU)."""
    global DEV
    DEV, jobs = arg
    qg, _ = kernels()
    gen = torch.Generator(device=DEV).manual_seed(1)
    errs, cache = [], {}
    for qt, k, m, cfg in jobs:
        try:
            if (qt, k) not in cache:
                cache[(qt, k)] = _repack(qt, 256, k, gen)
            x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
            qg.qgemm(x, cache[(qt, k)], config=cfg, interpret=DEV == "cpu")
        except Exception as e:                  # reported by the main process when it runs the config
            errs.append(f"{NAME[qt]} k{k} m{m} {cfg}: {type(e).__name__}")
    if DEV == "cuda":
        torch.cuda.synchronize()
    return errs


def _repack(qt, n, k, gen):
    lay = _load("minfer.ops.cuda.gemv_repack_layout", "minfer/ops/cuda/gemv_repack_layout.py")
    return lay.repack(random_raw(qt, n, k, gen), qt, n, k)


def precompile(runs, jobs: int) -> float:
    t = time.time()
    todo = sorted({(qt, k, m, cfg) for _, qt, n, k, m, cfg in runs})
    if jobs <= 1 or len(todo) < 4:
        return 0.0
    chunks = [todo[i::jobs] for i in range(jobs)]
    try:
        with mp.get_context("spawn").Pool(jobs) as pool:
            for errs in pool.map(_compile_worker, [(DEV, c) for c in chunks]):
                for e in errs:
                    print(f"  precompile: {e}", flush=True)
    except Exception as e:                      # the main process compiles what is missing
        print(f"  precompile failed ({type(e).__name__}: {e}); compiling in the run", flush=True)
    return time.time() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="two tiles per M bucket, one split target, no 'gate'")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (default min(12, CPUs); --smoke 1)")
    ap.add_argument("--rep", type=int, default=8, help="do_bench rep (ms)")
    ap.add_argument("--write-configs", action="store_true", help="write ops/cuda/qgemm_repack_h200.json")
    ap.add_argument("--configs-out", default=None, help="write the config table here (e.g. under $OUT)")
    ap.add_argument("--smoke", action="store_true", help="CPU check of this script: interpreter, tiny shapes")
    args = ap.parse_args(argv)
    global DEV, SHAPES, MS
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, MS = "cpu", (16,)
        SHAPES = [("small", Q4_K, 128, 512), ("small", Q6_K, 64, 512)]
    import triton.testing

    def bench(fn):
        if DEV == "cpu":
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return triton.testing.do_bench(fn, warmup=2, rep=args.rep, return_mode="median") * 1e-3

    t0 = time.time()
    qg, gr = kernels()
    runs = plan(args.quick)
    jobs = args.jobs if args.jobs is not None else 1 if args.smoke else min(12, os.cpu_count() or 1)
    tc = precompile(runs, jobs)
    print(f"{len(runs)} runs, {len({(r[1], r[3], r[4], r[5]) for r in runs})} kernel variants, "
          f"precompiled in {tc:.1f} s", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    res = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)", "torch": torch.__version__,
           "rows": [], "best": {}, "configs": {}}
    by_shape: dict = {}
    for r in runs:
        by_shape.setdefault(r[:4], []).append(r)
    for (label, qt, n, k), rs in by_shape.items():
        rw = _repack(qt, n, k, gen)
        dense = torch.empty((n, k), dtype=torch.float32 if DEV == "cpu" else torch.bfloat16, device=DEV)
        gr.dequantize_into(rw, dense, interpret=DEV == "cpu")
        dense = dense.to(torch.bfloat16)
        wbytes = rw.nbytes()
        for m in MS:
            mrs = [r for r in rs if r[4] == m]
            if not mrs:
                continue
            x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
            ref = torch.matmul(x, dense.t())
            t_cub = bench(lambda: torch.matmul(x, dense.t()))
            flop = 2.0 * m * n * k
            best = None
            for *_, cfg in mrs:
                try:
                    interp = DEV == "cpu"
                    out = qg.qgemm(x, rw, config=cfg, interpret=interp)
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    t = bench(lambda: qg.qgemm(x, rw, config=cfg, interpret=interp))
                except Exception as e:
                    print(f"  {label} {NAME[qt]} m{m} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                row = {"shape": label, "type": NAME[qt], "n": n, "k": k, "m": m, "config": list(cfg),
                       "s": t, "tb_s": wbytes / t / 1e12, "tflop_s": flop / t / 1e12, "rel_err_vs_cublas": err,
                       "cublas_s": t_cub}
                res["rows"].append(row)
                if err > 2e-2:
                    print(f"  WRONG {label} {NAME[qt]} m{m} {cfg}: rel err {err:.3g} against cuBLAS", flush=True)
                elif best is None or t < best["s"]:
                    best = row
            if best is None:
                continue
            key = f"{NAME[qt]} {n}x{k} m{m}"
            res["best"][key] = best
            res["configs"][key] = best["config"]
            print(f"{label:8s} {NAME[qt]} {n:6d}x{k:<5d} M={m:3d}  cuBLAS bf16 {t_cub * 1e6:8.1f} us "
                  f"{2 * n * k / t_cub / 1e12:5.2f} TB/s {flop / t_cub / 1e12:6.1f} TF | "
                  f"qgemm {best['s'] * 1e6:8.1f} us "
                  f"{best['tb_s']:5.2f} TB/s {best['tflop_s']:6.1f} TF  x{t_cub / best['s']:4.2f}  "
                  f"err {best['rel_err_vs_cublas']:.1e}  {best['config']}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)
        del rw, dense
        if DEV == "cuda":
            torch.cuda.empty_cache()
    res["wall_s"] = time.time() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    tot_c = sum(v["cublas_s"] for v in res["best"].values())
    tot_q = sum(v["s"] for v in res["best"].values())
    if tot_q:
        print(f"sum over shapes and M: cuBLAS {tot_c * 1e3:.2f} ms, qgemm {tot_q * 1e3:.2f} ms "
              f"(x{tot_c / tot_q:.2f}); wall {res['wall_s']:.0f} s")
    table = {"about": "H200 configs of minfer.ops.cuda.qgemm_repack: '<type> <N>x<K> m<bucket>' -> "
                      "[BN, BM, BK, SPLIT, num_warps, num_stages], from python3 minfer/bench/qgemm_sweep.py "
                      f"({res['gpu']}, {time.strftime('%Y-%m-%d')})",
             "measured": {k: f"{v['tb_s']:.2f} TB/s, {v['s'] * 1e6:.1f} us, cuBLAS bf16 {v['cublas_s'] * 1e6:.1f} us"
                          for k, v in res["best"].items()},
             "configs": res["configs"]}
    print(json.dumps(table, indent=1))
    for path in ([os.path.join(ROOT, "minfer", "ops", "cuda", "qgemm_repack_h200.json")]
                 if args.write_configs and not args.smoke else []) + ([args.configs_out] if args.configs_out else []):
        with open(path, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
