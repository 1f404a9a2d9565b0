"""ops/cuda/deltanet_step.py's kernels through Triton's sm_90 compiler on this CPU machine (no GPU: the
build only, kernel_data.sm90_builds) at the Qwen3.5 / Qwen3-Next decode shapes (key and value heads of
128: one program's state tile 128 x 128 with the gated norm fused, or 128 x 32 with the norm apart),
the projections' rows in bf16 and float32, the single-sequence (masked) and the batch engine's (slots)
forms, and the gated-norm kernel. Each build must not spill registers to local memory."""

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
S = importlib.import_module("minfer.ops.cuda.deltanet_step")   # (the package exports a function of that name)

T = GPUTarget("cuda", 90, 32)
out = {}
names = ["qkv", "z", "b_in", "a_in", "positions", "slots", "conv_ring", "conv_w", "s_ring", "dt_bias", "A", "norm_w",
         "out", "stride_x", "stride_z", "stride_b", "stride_a", "stride_o", "stride_cs", "stride_ck", "stride_ss",
         "stride_sr", "stride_sh", "stride_sk", "W", "KD", "Hk", "Hv", "Dk", "Dv", "R_BA", "GS_BA", "A_OFF", "RS",
         "q_scale", "eps"]
for xt in ("bf16", "fp32"):
    for slots in (False, True):
        for bv, warps in ((128, 8), (32, 4)):
            norm = bv == 128
            types = [f"*{xt}"] * 4 + ["*i64", "*i64"] + ["*fp32"] * 6 + [f"*{xt}" if norm else "*fp32"] \
                + ["i32"] * 21 + ["fp32", "fp32"]
            cex = dict(K=4, BK=128, BV=bv, TILED=True, MASKED=not slots, HAS_SLOTS=slots, NORM=norm)
            sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
            k = triton.compile(ASTSource(S._deltanet_step_kernel, sig, cex), target=T, options={"num_warps": warps})
            out[f"step_{xt}_{'slots' if slots else 'single'}_{bv}"] = k.asm["ptx"].count("st.local")
nn = ["o", "z", "norm_w", "out", "stride_o", "stride_z", "stride_out", "Dv", "eps"]
sig = dict(zip(nn, ["*fp32", "*bf16", "*fp32", "*bf16", "i32", "i32", "i32", "i32", "fp32"])) | {"BV": "constexpr"}
k = triton.compile(ASTSource(S._gated_norm_kernel, sig, dict(BV=128)), target=T, options={"num_warps": 4})
out["norm_bf16_128"] = k.asm["ptx"].count("st.local")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, None)


def test_kernels_build_for_sm90_without_spills(builds):
    assert len(builds) == 9, builds
    assert all(v == 0 for v in builds.values()), builds
