"""ops/cuda/ssm_step.py's kernels through Triton's sm_90 compiler on this CPU machine (no GPU: the
build only, kernel_data.sm90_builds), at Nemotron Nano 9B v2's decode shapes (128 heads of 80, N 128,
8 groups: blocks of 32 head channels) and a state of 256, the in-projection's rows in bf16 and float32,
the single-sequence (masked) and the batch engine's (slots) forms; the gate-norm kernel at a group of
1280 and 8192 channels. Each build must not spill registers to local memory."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import sm90_builds  # noqa: E402

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
S = importlib.import_module("minfer.ops.cuda.ssm_step")   # (the package exports a function of that name)

T = GPUTarget("cuda", 90, 32)
out = {}
step_names = ["zx", "stride_zx", "conv_w", "conv_b", "dt_bias", "A", "Dskip", "conv", "ssm", "slots", "positions", "y",
              "stride_cs", "stride_ck", "stride_ss", "stride_sr", "stride_sh", "stride_sp", "stride_y",
              "DI", "W", "P", "N", "HG", "GN"]
for zt in ("bf16", "fp32"):
    for slots in (False, True):
        for bp, bn in ((32, 128), (16, 256)):
            types = [f"*{zt}", "i32"] + ["*fp32"] * 7 + ["*i64", "*i64", "*fp32"] + ["i32"] * 13
            cex = dict(K=4, BP=bp, BN=bn, HAS_BIAS=True, HAS_SLOTS=slots, MASKED=not slots)
            sig = dict(zip(step_names, types)) | {c: "constexpr" for c in cex}
            k = triton.compile(ASTSource(S._ssm_step_kernel, sig, cex), target=T, options={"num_warps": 4})
            out[f"step_{zt}_{'slots' if slots else 'single'}_{bp}x{bn}"] = k.asm["ptx"].count("st.local")
for zt, ot in (("bf16", "bf16"), ("fp32", "fp32")):
    for bd, w in ((2048, 4), (8192, 8)):
        names = ["y", "zx", "w", "out", "stride_y", "stride_zx", "stride_o", "GS", "eps"]
        types = ["*fp32", f"*{zt}", "*fp32", f"*{ot}", "i32", "i32", "i32", "i32", "fp32"]
        cex = dict(BD=bd, HAS_W=True)
        sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
        k = triton.compile(ASTSource(S._gate_norm_kernel, sig, cex), target=T, options={"num_warps": w})
        out[f"norm_{zt}_{bd}"] = k.asm["ptx"].count("st.local")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, None)


def test_kernels_build_for_sm90_without_spills(builds):
    assert len(builds) == 12, builds
    assert all(v == 0 for v in builds.values()), builds
