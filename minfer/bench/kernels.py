"""Kernel benchmarks and the per-op profile of the engine on CUDA (run on the device).

    python -m minfer.bench.kernels [--json OUT.json] [--quick] [--sweep]
    python -m minfer.bench.kernels --profile [MODEL.gguf] [--prompt 3354] [--json OUT.json]
    python -m minfer.bench.kernels --profile [MODEL.gguf] --batch 32 [--prompt 512]

Without --profile: microbenchmarks at the Qwen2.5-7B Q4_K_M shapes. Weights are random valid
blocks made on the GPU (random bytes, finite f16 scales), with the types synth's Q4_K_M rule
gives each tensor of the 7B. Times are medians of triton.testing.do_bench (CUDA events). Rates:
dequant counts bytes read + written; GEMV counts the weight bytes (the activations are
negligible); GEMMs count 2*M*N*K. Prints a short table last.

--profile: torch.profiler over one prefill and one (eager) decode step of MODEL.gguf (default:
a 4-layer synthetic 7B), grouped by kernel, the launch-path counts of exactly one prefill, and
the decode step timed as a CUDA-graph replay.

--profile --batch B: the same for one decode step of B sequences (prompt tokens each) in the
BatchEngine: the eager step's kernels, then the step time with CUDA graphs (host work included).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from minfer.quants import f16_offsets


def random_raw(qt: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 (n, row_bytes) random blocks on the GPU with finite f16 scales."""
    from minfer.ops.cuda.dequant import LAYOUT

    _, qk, ts = LAYOUT[qt]
    if qt in (0, 1, 30):
        dt = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}[qt]
        return (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(dt).view(torch.uint8)
    nb = k // qk
    raw = torch.randint(0, 256, (n, nb, ts), dtype=torch.uint8, device="cuda", generator=gen)
    for off in f16_offsets(qt):
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
    ap.add_argument("--profile", nargs="?", const="", default=None, metavar="MODEL.gguf",
                    help="per-op profile of the engine (default model: a 4-layer 7B synth)")
    ap.add_argument("--prompt", type=int, default=3354, help="prompt tokens of the profiled prefill")
    ap.add_argument("--batch", type=int, default=0, help="with --profile: a batched decode step of B sequences")
    args = ap.parse_args(argv)
    if args.profile is not None and args.batch:
        return profile_batch(args.profile or None, args.batch, args.prompt, args.json)
    if args.profile is not None:
        return profile(args.profile or None, args.prompt, args.json)

    from minfer.bench.presets import get_preset
    from minfer.bench.synth import plan_tensors
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda import dequant, gemv, linear
    from minfer.switches import Switches

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
    no_gemv = Context(Switches(gemv=False))
    for name, n, k in (("qkv", 4608, 3584), ("gate", 18944, 3584)):
        w = qweight("blk.0.x.weight", 12, n, k, gen)
        for m in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_g = bench(lambda: gemv.gemv(x, w.raw, 12, n, k))
            t_d = bench(lambda: linear(x, w, None, no_gemv))
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


def top_kernels(prof, n=18):
    from collections import defaultdict

    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name if len(e.name) < 90 else e.name[:87] + "..."
            agg[name][0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            agg[name][1] += 1
    total = sum(v[0] for v in agg.values())
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])[:n]
    return total / 1e3, [(k, v[0] / 1e3, v[1], v[0] / total if total else 0) for k, v in rows]


def _show(title, total_ms, rows):
    print(f"\n== {title}: {total_ms:.2f} ms of GPU kernel time ==")
    print(f"{'ms':>8} {'share':>6} {'calls':>6}  kernel")
    for name, ms, calls, share in rows:
        print(f"{ms:8.3f} {share*100:5.1f}% {calls:6d}  {name}")


def _default_model(model: str | None) -> str:
    if model is None:
        import tempfile

        from minfer.bench.presets import get_preset
        from minfer.bench.synth import write_synth

        model = tempfile.mkdtemp() + "/q7b-4l.gguf"
        write_synth(model, get_preset("qwen2.5-7b").with_overrides(layers=4), "q4_k_m", seed=0, progress=False)
    return model


def profile_batch(model: str | None, batch: int, prompt: int, json_out: str | None) -> int:
    """Kernels of one eager decode step of `batch` sequences, and the graphed step time."""
    import time

    from torch.profiler import ProfilerActivity, profile as tprofile

    from minfer.ops import paths
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    model = _default_model(model)
    eng = Engine.load(model, device="cuda", ctx=prompt + 256)
    g = torch.Generator().manual_seed(0)
    res = {"batch": batch, "prompt": prompt}
    for graphs in (False, True):
        be = BatchEngine.from_engine(eng, max_seqs=batch, cuda_graphs=graphs, prefix_cache=False,
                                     kv_memory=None)
        seqs = [be.add(torch.randint(0, eng.config.vocab, (prompt,), generator=g).tolist(),
                       SamplingParams(temperature=0), 200, ignore_eos=True) for _ in range(batch)]
        while not all(s.n_generated >= 1 for s in seqs):
            be.step()
        for _ in range(3):                                  # warm: compile, capture
            be.step()
        torch.cuda.synchronize()
        if not graphs:
            paths.reset()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                be.step()
                torch.cuda.synchronize()
            total, rows = top_kernels(prof, 24)
            _show(f"batched decode step B={batch} (eager)", total, rows)
            res["eager_kernels_ms"], res["top"] = total, rows
            res["paths"] = paths.snapshot()
            print("launch paths of that step:", {k: v for k, v in sorted(res["paths"]["counts"].items())})
        t0 = time.perf_counter()
        for _ in range(20):
            be.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 20 * 1e3
        res["graph_step_ms" if graphs else "eager_step_ms"] = ms
        print(f"B={batch} decode step, {'CUDA graphs' if graphs else 'eager'}: {ms:.2f} ms "
              f"({batch / ms * 1e3:,.0f} t/s)")
        be.abort_all()
        del be
        torch.cuda.empty_cache()
    if json_out:
        with open(json_out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


def profile(model: str | None, prompt: int, json_out: str | None) -> int:
    """Per-op breakdown of one prefill and one decode step, plus the launch-path counts."""
    import dataclasses
    import tempfile
    import time

    from torch.profiler import ProfilerActivity, profile as tprofile

    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    model = _default_model(model)
    eng = Engine.load(model, device="cuda", ctx=prompt + 64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, eng.config.vocab, (prompt,), generator=g).tolist()
    eng.reset()
    eng.prefill(ids)                                    # warm-up: compile, allocate
    torch.cuda.synchronize()
    paths.reset()
    eng.reset()
    t0 = time.perf_counter()
    eng.prefill(ids)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    counts = paths.snapshot()
    print(f"one prefill of {prompt} tokens: {wall*1e3:.1f} ms wall ({prompt/wall:,.0f} tok/s)")
    print("launch paths of that one prefill:")
    for k, v in sorted(counts["counts"].items()):
        print(f"  {k}: {v}")
    for k, v in counts.get("switched_off", {}).items():
        print(f"  switched off: {k}: {v}")
    for k, v in counts.get("fallbacks", {}).items():
        print(f"  FELL BACK: {k}: {v}")
    eng.reset()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.prefill(ids)
        torch.cuda.synchronize()
    pf_total, pf_rows = top_kernels(prof)
    _show(f"prefill {prompt}", pf_total, pf_rows)
    graphed = eng.switches
    eng.set_switches(dataclasses.replace(graphed, cuda_graph=False))   # eager: each kernel shows
    pos = len(eng.tokens)
    eng.forward([1], pos)                                # warm the eager decode kernels
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.forward([2], pos + 1)
        torch.cuda.synchronize()
    dc_total, dc_rows = top_kernels(prof)
    _show("decode step (eager)", dc_total, dc_rows)
    eng.set_switches(graphed)
    eng.forward([3], pos + 2)                            # capture
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(20):
        eng.forward([4], pos + 3 + i)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / 20 * 1e3
    print(f"\ndecode step as a CUDA graph replay (incl. logits to host): {step_ms:.2f} ms")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"prefill_tokens": prompt, "prefill_wall_ms": wall * 1e3, "paths": counts,
                       "prefill_kernels_ms": pf_total, "prefill_top": pf_rows,
                       "decode_eager_kernels_ms": dc_total, "decode_top": dc_rows,
                       "decode_graph_step_ms": step_ms, "memory_report": getattr(eng, "memory_report", None)},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
