"""Device experiment: prefill attention variants at the 7B geometry (H=28, Hkv=4, Dh=128).

    python3 tools/exp_attn.py [--json OUT]

Times each variant of minfer.ops.cuda.attention's prefill (flash; cuDNN with the length
rounded up to 128: the exact-length variant was retired with MINFER_CUDNN_BUCKET, perf-log
section 11) at T=512 and 3354 with triton.testing.do_bench,
checks each against an fp32 float reference on the GPU, and times the first call at new
lengths (cuDNN builds an execution plan per shape). Prints a table last."""
import argparse
import json
import time

import torch
import triton

from minfer.ops import paths
from minfer.ops.context import Context
from minfer.ops.cuda.attention import attention
from minfer.switches import Switches

ap = argparse.ArgumentParser()
ap.add_argument("--json")
args = ap.parse_args()
H, HKV, DH = 28, 4, 128
res, table = {}, []
variants = {"flash": Context(Switches(cudnn_attention=False)),
            "cudnn.bucket128": Context(Switches())}


g = torch.Generator(device="cuda").manual_seed(0)
for T in (512, 3354):
    kc = torch.randn(4096, HKV, DH, device="cuda", generator=g).to(torch.bfloat16)
    vc = torch.randn(4096, HKV, DH, device="cuda", generator=g).to(torch.bfloat16)
    q = torch.randn(T, H, DH, device="cuda", generator=g).to(torch.bfloat16)
    kf = kc[:T].float().repeat_interleave(H // HKV, dim=1).transpose(0, 1)
    vf = vc[:T].float().repeat_interleave(H // HKV, dim=1).transpose(0, 1)
    sc = (q.float().transpose(0, 1) @ kf.transpose(1, 2)) / DH ** 0.5
    sc = sc.masked_fill(torch.ones(T, T, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    ref = (sc.softmax(-1) @ vf).transpose(0, 1)
    del sc
    for name, ctx in variants.items():
        paths.reset()
        try:
            out = attention(q, kc, vc, 0, ctx)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            snap = paths.snapshot()
            ms = triton.testing.do_bench(lambda: attention(q, kc, vc, 0, ctx), warmup=20, rep=200)
            fl = 4 * T * T / 2 * DH * H
            res[f"{name}.T{T}"] = {"ms": ms, "tflops": fl / ms / 1e9, "rel_err": err, "paths": snap}
            table.append(f"T={T:5d} {name:14s} {ms*1e3:8.1f} us  {fl/ms/1e9:6.0f} TFLOP/s  err {err:.1e}  "
                         f"paths {snap['counts']} fb {list(snap['fallbacks'])}")
        except Exception as e:  # noqa: BLE001 - an experiment: record what refused
            res[f"{name}.T{T}"] = {"error": str(e)[:200]}
            table.append(f"T={T:5d} {name:14s} ERROR {str(e).splitlines()[0][:100]}")
# first call at new lengths: cuDNN builds a plan per shape
for name, ctx in variants.items():
    for T in (1000, 1001, 1020, 2047, 3001, 3002):
        q = torch.randn(T, H, DH, device="cuda", generator=g).to(torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter(); attention(q, kc, vc, 0, ctx); torch.cuda.synchronize()
        t1 = time.perf_counter(); attention(q, kc, vc, 0, ctx); torch.cuda.synchronize()
        t2 = time.perf_counter()
        res[f"first.{name}.T{T}"] = {"first_ms": (t1 - t0) * 1e3, "second_ms": (t2 - t1) * 1e3}
        table.append(f"new length T={T} {name}: first call {(t1-t0)*1e3:.1f} ms, second {(t2-t1)*1e3:.2f} ms")
if args.json:
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
print("\n==== attention variants (H200) ====")
print("\n".join(table))
