"""Per-shape sweep of the repacked decode GEMV (ops/cuda/gemv_repack.py) beside the raw GEMV.

    python3 minfer/bench/gemv_sweep.py --json OUT.json [--quick] [--budget-s 240]
    (or python3 -m minfer.bench.gemv_sweep; the script form imports no minfer package code
    besides the kernel files it loads by path, so a half-done edit elsewhere cannot break it)

Shapes: the Qwen2.5-7B Q4_K_M linears (qkv, o, gate, gate+up as one weight, down in Q4_K and
Q6_K, the lm head) at M = 1, 8, 32. Weights: random valid blocks on the GPU, repacked there;
a rotating set of copies of each weight (>= 192 MB in all, the L2 holds 60 MB) so that no
call finds its weight in L2. Timing: one CUDA graph of R calls walking the copies, replayed
several times, the median replay / R (the way a decode step runs; graph gaps included).
Rates: weight bytes read per second, of the repacked planes and of the raw blocks they
replace, and the % of 4.1 TB/s (the H200's measured copy bandwidth, ANCHORS.md).
Configs are (BN, BB, SPLIT, num_warps) plus the decode (asm / portable); the best per shape
is printed as a JSON block for ops/cuda/gemv_repack_h200.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch

COPY_BW = 4.1e12
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Q4_K, Q6_K = 12, 14
NAME = {Q4_K: "Q4_K", Q6_K: "Q6_K"}

# (label, type, N, K)
SHAPES = [
    ("qkv", Q4_K, 4608, 3584),                   # q/k/v fused (one plane set) where all are Q4_K
    ("kv", Q4_K, 512, 3584),                     # k or v alone (layers whose attn_v is Q6_K)
    ("v", Q6_K, 512, 3584),
    ("o", Q4_K, 3584, 3584),
    ("gate", Q4_K, 18944, 3584),
    ("gate_up", Q4_K, 37888, 3584),
    ("down", Q4_K, 3584, 18944),
    ("down", Q6_K, 3584, 18944),
    ("lm_head", Q6_K, 152064, 3584),
]


def _load(modname: str, relpath: str):
    """A module loaded from its file under its package name, without importing the packages
    above it (minfer/__init__ imports the whole engine)."""
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def kernels():
    """(gemv_repack, raw gemv, raw dequant) modules."""
    _load("minfer.errors", "minfer/errors.py")
    _load("minfer.ops.cuda.gemv_repack_layout", "minfer/ops/cuda/gemv_repack_layout.py")
    gr = _load("minfer.ops.cuda.gemv_repack", "minfer/ops/cuda/gemv_repack.py")
    dq = _load("minfer.ops.cuda.dequant", "minfer/ops/cuda/dequant.py")
    gv = _load("minfer.ops.cuda.gemv", "minfer/ops/cuda/gemv.py")
    return gr, gv, dq


def random_raw(qt: int, n: int, k: int, gen, device: str = "cuda") -> torch.Tensor:
    """uint8 (n, row bytes) random Q4_K / Q6_K blocks on `device` with finite f16 scales."""
    ts = {Q4_K: 144, Q6_K: 210}[qt]
    nb = k // 256
    raw = torch.randint(0, 256, (n, nb, ts), dtype=torch.uint8, device=device, generator=gen)
    for off in {Q4_K: (0, 2), Q6_K: (208,)}[qt]:
        raw[:, :, off:off + 2] = (torch.randn(n, nb, 1, device=device, generator=gen) * 0.01).half().view(torch.uint8)
    return raw.view(n, nb * ts)


def graph_time(fn_list, reps: int = 5) -> float:
    """Seconds per call: the calls captured once in a CUDA graph, replayed `reps` times (median)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fn_list[:2]:
            f()                                           # compile + warm outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fn_list:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(fn_list))
    del g
    return sorted(times)[len(times) // 2]


def candidates(qt: int, m: int, quick: bool):
    """(BN, BB, target programs or fixed SPLIT, warps, asm) to try; SPLIT from the target."""
    if m == 1:
        if qt == Q4_K:
            c = [(128, 1, 4, False), (64, 1, 4, False), (128, 1, 8, False), (64, 1, 4, True), (64, 2, 4, False),
                 (32, 2, 4, False)]
        else:
            c = [(64, 1, 4, True), (32, 1, 4, True), (128, 1, 8, True), (64, 1, 8, True), (64, 1, 4, False)]
        targets = [264, 528, 1056]
    else:
        c = [(64, 1, 4, True), (32, 1, 4, True), (128, 1, 8, True)]
        targets = [264, 528]
    if quick:
        c, targets = c[:2], targets[1:2]
    return [(bn, bb, t, w, asm) for (bn, bb, w, asm) in c for t in targets]


def split_for(n, k, m, bn, bb, target):
    mt = 1 if m == 1 else -(-m // (16 if m <= 16 else 32 if m <= 32 else 64))
    tiles = -(-n // bn) * mt
    nb = k // 256
    return 1 if tiles >= target else max(1, min(-(-nb // bb), -(-target // tiles), 32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping new configs after this")
    ap.add_argument("--ms", default="1,8,32")
    ap.add_argument("--calls", type=int, default=48, help="calls per graph")
    args = ap.parse_args(argv)
    t_start = time.time()
    gr, gv, dq = kernels()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ms = [int(v) for v in args.ms.split(",")]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bw": COPY_BW, "rows": [],
           "dequant": [], "best": {}}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)

    ws = gr.GemvWorkspace("cuda")
    data = {}
    for label, qt, n, k in SHAPES:
        raw_bytes = n * k // 256 * {Q4_K: 144, Q6_K: 210}[qt]
        copies = max(2, min(24, -(-192_000_000 // raw_bytes)))
        raws = [random_raw(qt, n, k, gen) for _ in range(copies)]
        rws = [gr.repack(r, qt, n, k) for r in raws]
        dense = torch.empty(n, k, device="cuda", dtype=torch.float32)
        gr.dequantize_into(rws[0], dense)
        data[(label, qt)] = (raws, rws, dense, copies, raw_bytes, n * k // 256 * gr.REPACKED_BLOCK_BYTES[qt])
    for m in ms:                                  # M = 1 first: the budget runs out on the last
        for label, qt, n, k in SHAPES:
            raws, rws, dense, copies, raw_bytes, rp_bytes = data[(label, qt)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ dense.T
            calls = max(copies, args.calls)

            def err(y):
                return float((y.float() - ref).norm() / ref.norm())

            def row(kind, cfg, t, e):
                r = {"shape": label, "rel_err": e, "type": NAME[qt], "n": n, "k": k, "m": m, "kernel": kind,
                     "config": cfg, "us": t * 1e6, "gbps_repacked": rp_bytes / t / 1e9,
                     "gbps_raw_equiv": raw_bytes / t / 1e9, "pct_copy_bw": 100 * rp_bytes / t / COPY_BW}
                res["rows"].append(r)
                print(f"{label:8s} {NAME[qt]} {n}x{k} m={m:<3d} {kind:8s} {str(cfg):34s} {t * 1e6:8.1f} us "
                      f"{r['gbps_repacked']:7.0f} GB/s ({r['pct_copy_bw']:.0f}%) err {e:.1e}", flush=True)
                return r

            # the raw GEMV (the A side), its own default config
            try:
                t = graph_time([lambda i=i: gv.gemv(x, raws[i % copies], qt, n, k) for i in range(calls)])
                old = row("raw", "auto", t, err(gv.gemv(x, raws[0], qt, n, k)))
            except Exception as e:  # noqa: BLE001 -- record and go on
                old = None
                print(f"raw gemv failed: {e!r}", flush=True)
            best = None
            for bn, bb, target, w, asm in candidates(qt, m, args.quick):
                if time.time() - t_start > args.budget_s:
                    print("budget spent: skipping the remaining configs", flush=True)
                    break
                split = split_for(n, k, m, bn, bb, target)
                cfg = (bn, bb, split, w)
                try:
                    fns = [lambda i=i: gr.gemv(x, rws[i % copies], config=cfg, ws=ws, asm=asm) for i in range(calls)]
                    t = graph_time(fns)
                    r = row("repacked", list(cfg) + ["asm" if asm else "portable"], t,
                            err(gr.gemv(x, rws[0], config=cfg, ws=ws, asm=asm)))
                except Exception as e:  # noqa: BLE001
                    print(f"config {cfg} asm={asm} failed: {e!r}"[:300], flush=True)
                    continue
                if r["rel_err"] > 1e-2:
                    print(f"WRONG RESULT: rel err {r['rel_err']:.3g}", flush=True)
                    continue
                if best is None or r["us"] < best["us"]:
                    best = r
            if best is not None and m == 1 and time.time() - t_start < args.budget_s:
                cfg, asm = tuple(best["config"][:4]), best["config"][4] == "asm"
                xf = x.float()
                t = graph_time([lambda i=i: gr.gemv(xf, rws[i % copies], config=cfg, ws=ws, asm=asm) for i in range(calls)])
                row("repacked", list(cfg) + [best["config"][4], "x fp32"], t, err(gr.gemv(xf, rws[0], config=cfg, ws=ws, asm=asm)))
            if best is not None:
                key = f"{NAME[qt]} {n}x{k} m{1 if m == 1 else 16 if m <= 16 else 32 if m <= 32 else 64}"
                res["best"][key] = {"config": best["config"], "us": best["us"], "gbps": best["gbps_repacked"],
                                    "raw_us": old["us"] if old else None}
            save()
        if m == ms[0]:
            for label, qt, n, k in SHAPES:
                if label not in ("gate", "down"):
                    continue
                # dequant to bf16 (the prefill path): bytes read + written, new planes vs raw blocks
                raws, rws, dense, copies, raw_bytes, rp_bytes = data[(label, qt)]
                out = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
                for tile in [(8, 1), (16, 1), (8, 2), (32, 1)]:
                    t = graph_time([lambda i=i: gr.dequantize_into(rws[i % copies], out, tile=tile) for i in range(copies)])
                    tb = (rp_bytes + 2 * n * k) / t / 1e12
                    res["dequant"].append({"shape": label, "type": NAME[qt], "kernel": "repacked", "tile": tile, "tbps": tb})
                    print(f"dequant {label} {NAME[qt]} repacked tile={tile}: {tb:.2f} TB/s", flush=True)
                t = graph_time([lambda i=i: dq.dequantize_into(raws[i % copies], qt, n, k, out) for i in range(copies)])
                tb = (raw_bytes + 2 * n * k) / t / 1e12
                res["dequant"].append({"shape": label, "type": NAME[qt], "kernel": "raw", "tbps": tb})
                print(f"dequant {label} {NAME[qt]} raw: {tb:.2f} TB/s", flush=True)
                save()
    print(json.dumps({"configs": {k: [*v["config"][:4]] for k, v in res["best"].items()}}, indent=1))
    print("\n| shape | type | M | raw GEMV GB/s | repacked GB/s (planes) | raw-equiv GB/s | % of 4.1 TB/s | config |")
    print("|---|---|---|---|---|---|---|---|")
    for key, b in res["best"].items():
        r = next(r for r in res["rows"] if r["kernel"] == "repacked" and r["us"] == b["us"])
        o = next((q for q in res["rows"] if q["kernel"] == "raw" and q["n"] == r["n"] and q["k"] == r["k"]
                  and q["type"] == r["type"] and q["m"] == r["m"]), None)
        print(f"| {r['shape']} {r['n']}x{r['k']} | {r['type']} | {r['m']} | {o['gbps_raw_equiv'] if o else float('nan'):.0f} "
              f"| {r['gbps_repacked']:.0f} | {r['gbps_raw_equiv']:.0f} | {r['pct_copy_bw']:.0f} | {r['config']} |")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
