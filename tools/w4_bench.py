"""qgemm_w4_mma (minfer/ops/cuda/qgemm_w4_mma.py, over qgemm_w4's planes in fragment order) against cuBLAS on the dense bf16 weight, per 7B shape,
in one process: correctness (against x @ dequantize_w4(W)^T in float64, and one-hot rows read
back bit for bit) then timing (triton.testing.do_bench: the L2 is flushed before every call, so
the weight comes from HBM as in a decode step; median).

    python3 tools/w4_bench.py [--m 16,32,64,128] [--json OUT] [--configs BN,BM,BK,SPLIT,W,S;...]

Weights are random planes (the timing does not depend on the values); the dense bf16 weight is
their decode, so both sides multiply the same values.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

sys.path.insert(0, ".")
from minfer.ops.cuda import qgemm_w4 as Q  # noqa: E402
from minfer.ops.cuda import qgemm_w4_mma as G  # noqa: E402

SHAPES = [("qkv", 12, 4608, 3584), ("o", 12, 3584, 3584), ("gate_up", 12, 37888, 3584),
          ("down", 12, 3584, 18944), ("down", 14, 3584, 18944), ("lm_head", 14, 152064, 3584),
          ("v", 14, 512, 3584)]


def planes(qt, n, k, g):
    qw = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda", generator=g)
    if qt == 12:
        s = (torch.rand(n, k // 32, device="cuda", generator=g) * 0.01 + 0.001).to(torch.bfloat16)
        m = (torch.rand(n, k // 32, device="cuda", generator=g) * -0.08).to(torch.bfloat16)
        sm = (s.view(torch.int16).to(torch.int32) & 0xFFFF) | (m.view(torch.int16).to(torch.int32) << 16)
        return Q.W4Planes(qt, n, k, (qw, sm))
    qh = torch.randint(-2**15, 2**15 - 1, (n, k // 8), dtype=torch.int16, device="cuda", generator=g)
    s = ((torch.rand(n, k // 16, device="cuda", generator=g) - 0.5) * 0.004).to(torch.bfloat16)
    s = s.view(torch.int16).to(torch.int32) & 0xFFFF
    return Q.W4Planes(qt, n, k, (qw, qh, (s[:, 0::2] | (s[:, 1::2] << 16)).contiguous()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,32,64,128")
    ap.add_argument("--json")
    ap.add_argument("--configs", default="")
    ap.add_argument("--shapes", default="")
    a = ap.parse_args()
    ms = [int(v) for v in a.m.split(",")]
    extra = [tuple(int(v) for v in c.split(",")) for c in a.configs.split(";") if c]
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    t0 = time.time()
    tot = {"cublas": 0.0, "w4": 0.0}
    for label, qt, n, k in SHAPES:
        if a.shapes and label not in a.shapes.split(","):
            continue
        p = planes(qt, n, k, g)
        wd = Q.dequantize_w4(p).to(torch.bfloat16)                       # (n, k) bf16: the same values
        for m in ms:
            x = (torch.randn(m, k, device="cuda", generator=g)).to(torch.bfloat16)
            ref = (x.double() @ wd.double().T)
            cfgs = [None] + extra
            tc = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, wd), warmup=5, rep=40,
                                         return_mode="median")
            best = None
            for cfg in cfgs:
                try:
                    out = G.qgemm_w4_mma(x, p, out_dtype=torch.float32, config=cfg)
                    torch.cuda.synchronize()
                except Exception as e:                                  # noqa: BLE001
                    print(f"{label} {n}x{k} M={m} cfg {cfg}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                err = float((out.double() - ref).norm() / ref.norm())
                t = triton.testing.do_bench(lambda: G.qgemm_w4_mma(x, p, config=cfg), warmup=5, rep=40,
                                            return_mode="median")
                used = tuple(cfg or G.config_for(qt, m, n, k))
                r = dict(shape=label, type={12: "Q4_K", 14: "Q6_K"}[qt], n=n, k=k, m=m, config=list(used),
                         cublas_us=tc * 1e3, w4_us=t * 1e3, speedup=tc / t, err=err,
                         w4_tbs=p.nbytes() / t / 1e9, cublas_tbs=n * k * 2 / tc / 1e9)
                rows.append(r)
                print(f"{label:8s} {r['type']} {n:6d}x{k:<5d} M={m:3d} cuBLAS {tc*1e3:7.1f} us {r['cublas_tbs']:4.2f} TB/s"
                      f" | w4 {t*1e3:7.1f} us {r['w4_tbs']:4.2f} TB/s x{tc/t:4.2f} err {err:.1e} {used}", flush=True)
                if best is None or t < best[0]:
                    best = (t, used)
            if m == 32 and best:
                tot["cublas"] += tc
                tot["w4"] += best[0]
        del p, wd
        torch.cuda.empty_cache()
    # one-hot exactness on the GPU (the asm decode read back bit for bit)
    for qt in (12, 14):
        p = planes(qt, 256, 1024, g)
        want = Q.dequantize_w4(p)
        cols = torch.arange(0, 1024, 7, device="cuda")[:64]
        x = torch.zeros(64, 1024, device="cuda", dtype=torch.bfloat16)
        x[torch.arange(64, device="cuda"), cols] = 1.0
        out = G.qgemm_w4_mma(x, p, out_dtype=torch.float32)
        print(f"one-hot {qt}: exact={torch.equal(out, want[:, cols].T.float())}")
    print(f"M=32 sum over shapes (best config): cuBLAS {tot['cublas']*1e3:.0f} us, w4 {tot['w4']*1e3:.0f} us; "
          f"wall {time.time()-t0:.0f} s")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
