"""Device experiment: prefill attention variants at the 7B geometry (H=28, Hkv=4, Dh=128).

    python3 tools/exp_attn.py [--json OUT]

Times each variant of minfer.ops.cuda.attention's prefill (flash; cuDNN with the length
rounded up to 128, or exact) at T=512 and 3354 with triton.testing.do_bench,
checks each against an fp32 float reference on the GPU, and times the first call at new
lengths (cuDNN builds an execution plan per shape). Prints a table last."""
import argparse
import json
import os
import time

import torch
import triton

from minfer.ops import paths
from minfer.ops.cuda.attention import attention

ap = argparse.ArgumentParser()
ap.add_argument("--json")
args = ap.parse_args()
H, HKV, DH = 28, 4, 128
res, table = {}, []
variants = {"flash": {"MINFER_PREFILL_ATTN": "flash"},
            "cudnn.bucket128": {"MINFER_PREFILL_ATTN": "cudnn"},
            "cudnn.exact": {"MINFER_PREFILL_ATTN": "cudnn", "MINFER_CUDNN_BUCKET": "0"}}


def setenv(d):
    for k in ("MINFER_PREFILL_ATTN", "MINFER_CUDNN_BUCKET"):
        os.environ.pop(k, None)
    os.environ.update(d)


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
    for name, env in variants.items():
        setenv(env)
        paths.reset()
        try:
            out = attention(q, kc, vc, 0)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            snap = paths.snapshot()
            ms = triton.testing.do_bench(lambda: attention(q, kc, vc, 0), warmup=20, rep=200)
            fl = 4 * T * T / 2 * DH * H
            res[f"{name}.T{T}"] = {"ms": ms, "tflops": fl / ms / 1e9, "rel_err": err, "paths": snap}
            table.append(f"T={T:5d} {name:14s} {ms*1e3:8.1f} us  {fl/ms/1e9:6.0f} TFLOP/s  err {err:.1e}  "
                         f"paths {snap['counts']} fb {list(snap['fallbacks'])}")
        except Exception as e:  # noqa: BLE001 - an experiment: record what refused
            res[f"{name}.T{T}"] = {"error": str(e)[:200]}
            table.append(f"T={T:5d} {name:14s} ERROR {str(e).splitlines()[0][:100]}")
# first call at new lengths: cuDNN builds a plan per shape
for name in ("flash", "cudnn.exact", "cudnn.bucket128"):
    setenv(variants[name])
    for T in (1000, 1001, 1020, 2047, 3001, 3002):
        q = torch.randn(T, H, DH, device="cuda", generator=g).to(torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter(); attention(q, kc, vc, 0); torch.cuda.synchronize()
        t1 = time.perf_counter(); attention(q, kc, vc, 0); torch.cuda.synchronize()
        t2 = time.perf_counter()
        res[f"first.{name}.T{T}"] = {"first_ms": (t1 - t0) * 1e3, "second_ms": (t2 - t1) * 1e3}
        table.append(f"new length T={T} {name}: first call {(t1-t0)*1e3:.1f} ms, second {(t2-t1)*1e3:.2f} ms")
if args.json:
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
print("\n==== attention variants (H200) ====")
print("\n".join(table))
