"""Which part of the raw GEMV's halfword reads goes wrong on the GPU (perf-log AZ0: Q5_0 with a bfloat16 row
at the one-pass BN 4 tile fails against the gguf package's weights, float32 rows and BN 8 pass). Each variant
replaces gemv._runs_dot_hw (or dequant.decode_hw through it) in a fresh process and Triton cache, runs the
failing shapes, and prints the relative error against float64.
    python tools/hw_bisect.py            (all variants; one subprocess each)
    python tools/hw_bisect.py VARIANT    (one, in this process)"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import triton
import triton.language as tl

from minfer.ops.cuda.dequant import _ldh
from minfer.ops.cuda.pdl import enter as pdl_enter

VARIANTS = ["ctrl", "xpair", "qhbytes", "qsu16", "qhrow", "copy"]   # ctrl: the shipped reads; copy: the first (uint16 qh) form


VV = tl.constexpr(VARIANTS.index(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] in VARIANTS else 0)


@triton.jit
def dec(QT: tl.constexpr, bp, e0, m, V: tl.constexpr):
    j = tl.arange(0, 8)[None, :]
    d = _ldh(bp, m)
    if V == 3:   # qsu16: the quant halfwords read unsigned
        h = tl.load((bp + 6).to(tl.pointer_type(tl.uint16)) + j, mask=m, other=0).to(tl.int32)
    else:
        h = tl.load((bp + 6).to(tl.pointer_type(tl.int16)) + j, mask=m, other=0).to(tl.int32)
    sh = (e0 // 16) * 4
    lo = (h >> sh) & 15
    hi = (h >> (sh + 8)) & 15
    if V == 2:   # qhbytes: the fifth bits from two byte loads
        b0 = tl.load(bp + 2 + e0 // 8, mask=m, other=0).to(tl.int32)
        b1 = tl.load(bp + 3 + e0 // 8, mask=m, other=0).to(tl.int32)
        qb = (b0 | (b1 << 8)) >> (2 * j)
    elif V == 4:  # qhrow: the fifth bits' halfword loaded [R, 8]-wide (each column the same address)
        qb = tl.load((bp + 2 + e0 // 8 + 0 * j).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32) >> (2 * j)
    else:
        qb = tl.load((bp + 2 + e0 // 8).to(tl.pointer_type(tl.uint16)), mask=m, other=0).to(tl.int32) >> (2 * j)
    lo = (lo | (qb << 4 & 16)) - 16
    hi = (hi | (qb << 3 & 16)) - 16
    return lo.to(tl.float32) * d, hi.to(tl.float32) * d


@triton.jit
def runs(rowp, n_run, k0, xrow, N, K, QT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, PDL: tl.constexpr):
    m = ((n_run < N) & (k0 < K))[:, None]
    we, wo = dec(QT, (rowp + (k0 // QK) * TS)[:, None], (k0 % QK)[:, None], m, VV)
    pdl_enter(PDL)
    if xrow.dtype.element_ty == tl.bfloat16 and VV != 1:
        xw = tl.load((xrow + k0[:, None]).to(tl.pointer_type(tl.int32)) + tl.arange(0, 8)[None, :], mask=m, other=0)
        return we * (xw << 16).to(tl.float32, bitcast=True) + wo * (xw & -65536).to(tl.float32, bitcast=True)
    xp = xrow + k0[:, None] + 2 * tl.arange(0, 8)[None, :]
    return we * tl.load(xp, mask=m, other=0.0).to(tl.float32) + wo * tl.load(xp + 1, mask=m, other=0.0).to(tl.float32)


def one(variant: str) -> None:
    import torch
    from gguf import GGMLQuantizationType as T

    from minfer.ops.cuda import gemv as G
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
    from kernel_data import rel_err
    import test_kernels_gpu
    from test_kernels_gpu import make_weight

    dev = "cuda" if torch.cuda.is_available() else "cpu"     # (cpu: a local check under TRITON_INTERPRET=1)
    test_kernels_gpu.DEV = dev

    if variant != "ctrl":
        G._runs_dot_hw = runs
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        for n, k in ((896, 896), (1152, 896), (9728, 896), (1536, 576)):
            w, ref_w = make_weight(int(T.Q5_0), n, k, seed=n + k)
            x = torch.randn(1, k, device=dev, dtype=dtype)
            ref = x.double().cpu() @ ref_w.double().T
            hw = G.gemv(x, w.raw, int(T.Q5_0), n, k, one_pass=True, halfwords=True, interpret=dev == "cpu", out_dtype=torch.float32)
            out.append(f"{str(dtype)[6:]}:{n}x{k}={rel_err(hw.cpu(), ref):.1e}")
    print(f"{variant:8s} " + " ".join(out), flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        one(sys.argv[1])
        return
    for v in VARIANTS:
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp())
        r = subprocess.run([sys.executable, __file__, v], env=env, capture_output=True, text=True)
        print(r.stdout.strip() or f"{v}: rc {r.returncode} {r.stderr.strip()[-400:]}", flush=True)


if __name__ == "__main__":
    main()
