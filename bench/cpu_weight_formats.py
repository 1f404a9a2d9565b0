"""One-token decode matmuls of the Qwen2.5-0.5B's shapes in candidate CPU weight formats, A/B
interleaved (issue 14). 24 layers' own matrices (q, k, v, o, gate, up, down) plus the vocabulary
projection, so a token reads every weight once from memory as a real decode step does; random
weights (speed only). Rounds alternate the formats' order; prints best and median per token and
per matrix kind. Usage:
    OMP_WAIT_POLICY=PASSIVE python bench/cpu_weight_formats.py [threads] [rounds] [formats,...]"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

D, FF, KV, V, L = 896, 4864, 128, 151936, 24
KINDS = [("q", D, D), ("k", KV, D), ("v", KV, D), ("o", D, D), ("gate", FF, D), ("up", FF, D), ("down", D, FF)]


def int8_fmt(w):
    s = (w.abs().amax(1) / 127).bfloat16()
    q = torch.round(w / s.float()[:, None]).clamp(-128, 127).to(torch.int8)
    return lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, s).float(), q.numel() + 2 * s.numel()


def int4_fmt(g):
    def make(w):
        N, K = w.shape
        wg = w.reshape(N, K // g, g)
        lo, hi = wg.amin(-1), wg.amax(-1)
        s = ((hi - lo) / 15).clamp_min(1e-8)
        q = torch.round((wg - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32).reshape(N, K)
        z = lo + 8 * s                                    # (q - 8) * s + z == q * s + lo
        sz = torch.stack([s.T, z.T], -1).bfloat16().contiguous()   # (K/g, N, 2)
        p = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), p, g, sz).float(), p.numel() + sz.numel() * 2
    return make


def fbgemm_fmt(w):
    s = (w.abs().amax(1) / 127).double().clamp_min(1e-10)
    qw = torch.quantize_per_channel(w, s, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(qw, None)
    return lambda x: torch.ops.quantized.linear_dynamic(x, packed, True), w.numel()


def bf16_fmt(w):
    wb = w.bfloat16()
    return lambda x: F.linear(x.bfloat16(), wb).float(), 2 * w.numel()


def f32_fmt(w):
    wf = w.clone()
    return lambda x: F.linear(x, wf), 4 * w.numel()


FORMATS = {"int8": int8_fmt, "int4g32": int4_fmt(32), "int4g64": int4_fmt(64), "int4g128": int4_fmt(128),
           "fbgemm": fbgemm_fmt, "bf16": bf16_fmt, "f32": f32_fmt}


def build(fmt):
    g = torch.Generator().manual_seed(0)
    layers, nbytes = [], 0
    for _ in range(L):
        layer = []
        for name, n, k in KINDS:
            fn, b = FORMATS[fmt](torch.randn(n, k, generator=g) * 0.05)
            layer.append((name, fn))
            nbytes += b
        layers.append(layer)
    out, b = FORMATS[fmt](torch.randn(V, D, generator=g) * 0.05)
    return layers, out, nbytes + b


def token(layers, out, x, x4, times):
    for layer in layers:
        for name, fn in layer:
            t = time.perf_counter()
            fn(x4 if name == "down" else x)
            times[name] = times.get(name, 0.0) + time.perf_counter() - t
    t = time.perf_counter()
    out(x)
    times["output"] = times.get("output", 0.0) + time.perf_counter() - t


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    fmts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["int8", "int4g32", "fbgemm"]
    torch.set_num_threads(threads)
    built = {f: build(f) for f in fmts}
    x, x4 = torch.randn(1, D), torch.randn(1, FF)
    res = {f: [] for f in fmts}
    kinds = {f: [] for f in fmts}
    for f in fmts:                       # warm-up
        token(*built[f][:2], x, x4, {})
    for r in range(rounds):
        order = fmts if r % 2 == 0 else fmts[::-1]
        for f in order:
            times = {}
            t = time.perf_counter()
            token(*built[f][:2], x, x4, times)
            res[f].append(time.perf_counter() - t)
            kinds[f].append(times)
    print(f"threads {threads}, {rounds} rounds, load {os.getloadavg()[0]:.2f}")
    for f in fmts:
        ts = res[f]
        best = min(range(len(ts)), key=ts.__getitem__)
        per = " ".join(f"{k} {1e3 * v:.1f}" for k, v in kinds[f][best].items())
        print(f"{f:9s} {built[f][2] / 2**20:7.0f} MiB  best {1e3 * min(ts):7.1f} ms  median "
              f"{1e3 * statistics.median(ts):7.1f} ms  ({built[f][2] / min(ts) / 1e9:5.1f} GB/s)  best's: {per}")


if __name__ == "__main__":
    main()
