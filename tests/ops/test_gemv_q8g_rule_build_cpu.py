"""The Gluon q8 GEMV's builds for sm_90 (made here, no GPU) in the kernel variants the shape rule
(gemv_q8g_table.shape_rule, Switches.gemv_q8g_rule) brings that no 7B launch has compiled: q/k/v with
16-block steps and warps along K (K > 4096: 14B-class models), all Q4_K and with a Q6_K v; an o wider
than its K (Gemma's 2560 x 2048) on q/k/v's 8-row tiles with the residual epilogue and warps along K,
without and with the tile sums' rstd (NORM 4); the rope epilogue at head dim 256 beside the 7B's 128.
Each must build, hold dp4a, and spill nothing to local memory (the rope builds: no more than the 7B's
head dim 128 build). Their numbers on the GPU: tests/gpu/test_gemv_q8g_rule_gpu.py."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import GEMV_Q8G_TAIL, sm90_builds  # noqa: E402

_COMPILE = r"""
import json, sys, time
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda import gemv_q8_gluon_rope as GR

T = GPUTarget("cuda", 90, 32)
q4 = ["*i32", "*i32", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
out = {}
def build(kern, types, cex, nw):
    names = [p.name for p in kern.params if not p.is_constexpr]
    assert len(names) == len(types), (len(names), len(types))
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(kern, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(10)})
    t = time.time()
    k = triton.compile(src, target=T, options={"num_warps": nw})
    return k.asm["ptx"], time.time() - t
plain_tail = json.loads(sys.argv[1])["tail"]
base = dict(QT=12, QTB=12, MIXED=False, BN=8, BB=16, NW=4, IS_SPLIT=False, HAS_BIAS=True, HAS_RESID=False, PDL=1,
            PF=True, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=False, WK=True, SF=False, TM=0, XP=True)
for name, over in {"qkv16": {}, "qkv16 mixed": dict(QTB=14, MIXED=True, SF=True),
                   "o-wide rss": dict(BB=8, PF=2, RSS=True, HAS_BIAS=False, PRE=False, XP=False),
                   "o-wide rss rl": dict(BB=8, PF=2, RSS=True, HAS_BIAS=False, NORM=4, KP2=128, RL=True, XP=False)}.items():
    cex = base | over
    planes = q4 + (q6 if cex["MIXED"] else q4)
    ptx, dt = build(GL._gemv_q8g_kernel, planes + plain_tail, cex, 4)
    out[name] = [ptx.count("st.local"), ptx.count("dp4a"), round(dt, 1)]
rope_types = ["*i32", "*fp32", "*bf16", "*bf16"] + ["i32"] * 5 + ["*bf16", "i32", "fp32", "*i32", "*fp32", "*bf16", "*bf16", "i32", "i32", "i32", "*i64"]
for name, hd in (("rope hd256", 256), ("rope hd128", 128)):
    cex = dict(QT=12, QTB=14, MIXED=True, BN=8, BB=8, NW=4, HAS_BIAS=False, PDL=1, PF=2, PRE=False, NORM=4, KP2=128,
               WK=True, SF=True, TM=0, XP=True, RP=1, HD=hd, RL=True)
    ptx, dt = build(GR._gemv_q8g_rope_kernel, q4 + q6 + rope_types, cex, 4)
    out[name] = [ptx.count("st.local"), ptx.count("dp4a"), round(dt, 1)]
print(json.dumps(out))

"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, {"tail": GEMV_Q8G_TAIL})


@pytest.mark.parametrize("name", ["qkv16", "qkv16 mixed", "o-wide rss", "o-wide rss rl"])
def test_rule_variants_build_without_spills(builds, name):
    spills, dp4a, _ = builds[name]
    assert spills == 0 and dp4a > 0, builds[name]


def test_rope_epilogue_at_head_dim_256_builds_like_128(builds):
    assert builds["rope hd256"][1] > 0
    assert builds["rope hd256"][0] <= builds["rope hd128"][0], builds
