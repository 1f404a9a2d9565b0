"""Microbenchmarks of the CUDA kernels at the Qwen2.5-7B Q4_K_M shapes (run on the device).

    python -m minfer.ops.cuda.bench_kernels [--json OUT.json] [--quick]

Weights are random valid blocks made on the GPU (random bytes, finite f16 scales), with the
types synth's Q4_K_M rule gives each tensor of the 7B. Times are medians of
triton.testing.do_bench (CUDA events). Rates: dequant counts bytes read + written; GEMV
counts the weight bytes (the activations are negligible); GEMMs count 2*M*N*K.
Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def _f16_offsets():
    return {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 10: (80, 82), 11: (108,), 12: (0, 2),
            13: (0, 2), 14: (208,)}


def random_raw(qt: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 (n, row_bytes) random blocks on the GPU with finite f16 scales."""
    from minfer.ops.cuda.dequant import LAYOUT

    _, qk, ts = LAYOUT[qt]
    if qt in (0, 1, 30):
        dt = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}[qt]
        return (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(dt).view(torch.uint8)
    nb = k // qk
    raw = torch.randint(0, 256, (n, nb, ts), dtype=torch.uint8, device="cuda", generator=gen)
    for off in _f16_offsets()[qt]:
        raw[:, :, off:off + 2] = (torch.randn(n, nb, 1, device="cuda", generator=gen) * 0.01).half().view(torch.uint8)
    return raw.view(n, nb * ts)


def qweight(name, qt, n, k, gen):
    from minfer.ops.cuda import prepare_weight
    from minfer.weights import QWeight

    w = QWeight(name, qt, (n, k), random_raw(qt, n, k, gen))
    prepare_weight(w)
    return w


def bench(fn, rep=100):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")  # ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="tile/warp sweeps of dequant and GEMV")
    ap.add_argument("--profile", action="store_true", help="per-op profile of the engine on a 4-layer 7B synth")
    args = ap.parse_args(argv)

    from minfer.bench.presets import get_preset
    from minfer.bench.synth import plan_tensors
    from minfer.ops import paths
    from minfer.ops.cuda import dequant, gemv, linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton
    res["triton"] = triton.__version__
    table: list[str] = []

    # ceilings
    a = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    res["copy_TBps"] = 2 * a.numel() / ms / 1e9
    table.append(f"device copy: {res['copy_TBps']:.2f} TB/s (read+write)")
    del a, b

    # dequant bandwidth per type at the 7B ffn shape (18944 x 3584) -> bf16
    n, k = 18944, 3584
    out = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
    res["dequant"] = {}
    for qt in (12, 14, 6, 8, 2, 3, 13, 7, 10, 11, 1):
        raw = random_raw(qt, n, k, gen)
        ms = bench(lambda: dequant.dequantize_into(raw, qt, n, k, out))
        tbps = (raw.numel() + out.numel() * 2) / ms / 1e9
        res["dequant"][dequant.type_name(qt)] = {"ms": ms, "TBps": tbps}
        table.append(f"dequant {dequant.type_name(qt):5s} 18944x3584 -> bf16: {ms*1e3:7.1f} us  {tbps:.2f} TB/s")
    del out, raw

    # GEMV (M=1, bf16 activations) at the decode shapes
    shapes = [("qkv", 4608, 3584, 12), ("o", 3584, 3584, 12), ("gate_up", 37888, 3584, 12),
              ("down", 3584, 18944, 12), ("down_q6", 3584, 18944, 14), ("lm_head_q6", 152064, 3584, 14)]
    res["gemv"] = {}
    for name, n, k, qt in shapes:
        raw = random_raw(qt, n, k, gen)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        cfg = gemv.gemv_config(qt, 1, n, k, False)
        ms = bench(lambda: gemv.gemv(x, raw, qt, n, k))
        gbps = raw.numel() / ms / 1e6
        res["gemv"][name] = {"ms": ms, "GBps": gbps, "config": list(map(str, cfg))}
        table.append(f"gemv M=1 {name:10s} {dequant.type_name(qt)} {n}x{k}: {ms*1e3:7.1f} us  {gbps:6.0f} GB/s  cfg {cfg}")
    # crossover: GEMV vs dequant+cuBLAS by M on two shapes
    res["crossover"] = {}
    for name, n, k in (("qkv", 4608, 3584), ("gate", 18944, 3584)):
        w = qweight("blk.0.x.weight", 12, n, k, gen)
        for m in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_g = bench(lambda: gemv.gemv(x, w.raw, 12, n, k))
            import os
            os.environ["MINFER_GEMV"] = "0"
            t_d = bench(lambda: linear(x, w))
            os.environ.pop("MINFER_GEMV")
            res["crossover"][f"{name}.M{m}"] = {"gemv_ms": t_g, "dequant_cublas_ms": t_d}
            table.append(f"M={m:3d} {name:5s}: gemv {t_g*1e3:7.1f} us   dequant+cuBLAS {t_d*1e3:7.1f} us")

    # all 28 layers' linear layers of the 7B Q4_K_M (types from synth's rule)
    plans = [p for p in plan_tensors(get_preset("qwen2.5-7b"), "q4_k_m")
             if p.kind == "weight" and p.name.startswith("blk.")]
    ws = [qweight(p.name, int(p.qtype), p.shape[0], p.shape[1], gen) for p in plans]
    bytes_w = sum(w.raw.numel() for w in ws)
    res["layers_weight_GB"] = bytes_w / 1e9
    flop_tok = sum(2 * w.shape[0] * w.shape[1] for w in ws)
    res["prefill"] = {}
    for m in ((512,) if args.quick else (512, 3354)):
        x = torch.randn(m, 3584, device="cuda", dtype=torch.bfloat16)
        xf = torch.randn(m, 18944, device="cuda", dtype=torch.bfloat16)

        def run_all():
            for w in ws:
                linear(xf if w.shape[1] == 18944 else x, w)
        ms = bench(run_all, rep=200)
        # cuBLAS alone on one layer's dense bf16 weights, x 28
        dense = [torch.randn(w.shape, device="cuda", dtype=torch.bfloat16) for w in ws[:7]]
        ms_cublas = 28 * bench(lambda: [torch.matmul(xf if d.shape[1] == 18944 else x, d.t()) for d in dense])
        del dense
        res["prefill"][m] = {"ms": ms, "TFLOPs": flop_tok * m / ms / 1e9, "tok_s_linear": m / ms * 1e3,
                             "cublas_only_ms": ms_cublas}
        table.append(f"28 layers' linears M={m}: dequant+cuBLAS {ms:.2f} ms ({flop_tok*m/ms/1e9:.0f} TFLOP/s, "
                     f"{m/ms*1e3:,.0f} tok/s); cuBLAS alone {ms_cublas:.2f} ms")
    # the decode step's linears (M=1) summed
    x1 = torch.randn(1, 3584, device="cuda", dtype=torch.bfloat16)
    xf1 = torch.randn(1, 18944, device="cuda", dtype=torch.bfloat16)
    paths.reset()
    ms = bench(lambda: [linear(xf1 if w.shape[1] == 18944 else x1, w) for w in ws])
    res["decode_linears_ms"] = ms
    res["decode_linears_GBps"] = bytes_w / ms / 1e6
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for w in ws:
            linear(xf1 if w.shape[1] == 18944 else x1, w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for w in ws:
            linear(xf1 if w.shape[1] == 18944 else x1, w)
    msg = bench(lambda: g.replay())
    res["decode_linears_graph_ms"] = msg
    table.append(f"decode linears (196 GEMVs, {bytes_w/1e9:.2f} GB): eager {ms:.2f} ms ({bytes_w/ms/1e6:.0f} GB/s), "
                 f"CUDA graph {msg:.2f} ms ({bytes_w/msg/1e6:.0f} GB/s)")

    if args.sweep:
        sweep(gen, res, table)
    if args.profile:
        profile(res, table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print("\n==== kernel microbenchmarks ({}) ====".format(res["device"]))
    print("\n".join(table))
    return 0


def sweep(gen, res, table):
    from minfer.ops.cuda import dequant, gemv

    res["sweep"] = {}
    n, k = 18944, 3584
    out = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
    for qt in (12, 14):
        raw = random_raw(qt, n, k, gen)
        best = None
        for tile in ((8, 256), (16, 256), (32, 256), (16, 512), (64, 128)):
            for nw in (4, 8):
                ms = bench(lambda: dequant.dequantize_into(raw, qt, n, k, out, tile=tile, num_warps=nw))
                tbps = (raw.numel() + out.numel() * 2) / ms / 1e9
                res["sweep"][f"dequant.{qt}.{tile}.{nw}"] = tbps
                best = max(best or (0,), (tbps, tile, nw))
        table.append(f"sweep dequant {dequant.type_name(qt)}: best {best[0]:.2f} TB/s at tile {best[1]} warps {best[2]}")
    del out
    for name, n, k, qt in (("qkv", 4608, 3584, 12), ("gate_up", 37888, 3584, 12), ("down_q6", 3584, 18944, 14),
                           ("lm_head_q6", 152064, 3584, 14)):
        raw = random_raw(qt, n, k, gen)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        best = None
        for tile in ((8, 256), (16, 256), (32, 256), (64, 256), (16, 512)):
            for nw in (2, 4, 8):
                ms = bench(lambda: gemv.gemv(x, raw, qt, n, k, tile=tile, num_warps=nw))
                gbps = raw.numel() / ms / 1e6
                res["sweep"][f"gemv.{name}.{tile}.{nw}"] = gbps
                best = max(best or (0,), (gbps, tile, nw))
        table.append(f"sweep gemv M=1 {name}: best {best[0]:.0f} GB/s at tile {best[1]} warps {best[2]}")


def profile(res, table):
    """torch.profiler over one prefill (512) and one decode step of a 4-layer 7B-geometry synth."""
    import tempfile
    import time

    from torch.profiler import ProfilerActivity, profile as tprofile

    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    path = tempfile.mkdtemp() + "/q7b-4l.gguf"
    t0 = time.time()
    write_synth(path, get_preset("qwen2.5-7b").with_overrides(layers=4), "q4_k_m", seed=0, progress=False)
    table.append(f"synth 4-layer 7B: {time.time() - t0:.1f} s")
    t0 = time.time()
    eng = Engine.load(path, device="cuda", ctx=4096, progress=False)
    torch.cuda.synchronize()
    table.append(f"load: {time.time() - t0:.1f} s")
    ids = torch.randint(0, 150000, (512,)).tolist()
    for _ in range(2):
        eng.forward(ids, 0)
        eng.forward(ids[:1], 512)
    paths.reset()
    for name, toks, pos in (("prefill512", ids, 0), ("decode", ids[:1], 512)):
        torch.cuda.synchronize()
        with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            eng.forward(toks, pos)
            torch.cuda.synchronize()
        tab = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
        print(f"\n---- profile {name} (4 layers of the 7B, engine as committed) ----\n{tab}")
        res[f"profile_{name}"] = tab
    from minfer.runtime.cuda_graphs import DecodeGraph

    g = DecodeGraph(eng.model, eng.cache)
    g.step(ids[0], 512)
    tok = torch.tensor([ids[0]], device="cuda")
    with torch.inference_mode():
        ms_eager = bench(lambda: eng.model.forward(tok, 512, eng.cache))
        ms_graph = bench(lambda: g.step(ids[0], 512))
    res["decode_step_4layer_ms"] = {"eager": ms_eager, "graph": ms_graph}
    table.append(f"decode step, 4-layer 7B + lm head: eager {ms_eager:.2f} ms, CUDA graph {ms_graph:.2f} ms")
    table.append("launch paths of one 4-layer prefill(512) + one decode step: " +
                 ", ".join(f"{k}={v}" for k, v in sorted(paths.snapshot()["counts"].items())))


if __name__ == "__main__":
    sys.exit(main())
