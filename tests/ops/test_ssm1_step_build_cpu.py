"""ops/cuda/ssm1_step.py's kernels through Triton's sm_90 compiler on this CPU machine (no GPU: the build
only, kernel_data.sm90_builds), at Falcon-Mamba-7B's decode shapes (d_inner 8192, N 16: blocks of 64
channels for the scan, 256 for the conv), the in-projection's rows in bf16 and float32, the single-sequence
(masked) and the batch engine's (slots) forms, B/C norms weightless and weighted. Each build must not spill
registers to local memory."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import sm90_builds  # noqa: E402

_COMPILE = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
S = importlib.import_module("minfer.ops.cuda.ssm1_step")

T = GPUTarget("cuda", 90, 32)
out = {}
conv_names = ["xz", "stride_xz", "conv_w", "conv_b", "conv", "slots", "positions", "out", "stride_cs", "stride_ck",
              "stride_o", "DI"]
scan_names = ["xc", "stride_x", "dtr", "stride_dt", "dt_b", "Bm", "stride_b", "Cm", "stride_c", "A", "Dskip", "xz",
              "stride_xz", "ssm", "slots", "positions", "out", "bw", "cw", "stride_ss", "stride_sr", "stride_sd",
              "stride_o", "DI", "N", "eps"]
for zt in ("bf16", "fp32"):
    for slots in (False, True):
        types = [f"*{zt}", "i32", "*fp32", "*fp32", "*fp32", "*i64", "*i64", "*fp32", "i32", "i32", "i32", "i32"]
        cex = dict(K=4, BD=256, HAS_SLOTS=slots, MASKED=not slots)
        sig = dict(zip(conv_names, types)) | {c: "constexpr" for c in cex}
        k = triton.compile(ASTSource(S._conv1_kernel, sig, cex), target=T, options={"num_warps": 4})
        out[f"conv_{zt}_{'slots' if slots else 'single'}"] = k.asm["ptx"].count("st.local")
        for norm, nw in ((False, False), (True, False), (True, True)):
            types = (["*fp32", "i32", f"*{zt}", "i32", "*fp32", "*fp32", "i32", "*fp32", "i32", "*fp32", "*fp32",
                      f"*{zt}", "i32", "*fp32", "*i64", "*i64", f"*{zt}", "*fp32", "*fp32"] + ["i32"] * 6 + ["fp32"])
            cex = dict(BD=64, BN=16, NORM=norm, NORM_W=nw, HAS_SLOTS=slots, MASKED=not slots)
            sig = dict(zip(scan_names, types)) | {c: "constexpr" for c in cex}
            k = triton.compile(ASTSource(S._scan1_kernel, sig, cex), target=T, options={"num_warps": 4})
            out[f"scan_{zt}_{'slots' if slots else 'single'}_{norm}_{nw}"] = k.asm["ptx"].count("st.local")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, None)


def test_kernels_build_for_sm90_without_spills(builds):
    assert len(builds) == 16, builds
    assert all(v == 0 for v in builds.values()), builds
