"""The Gluon q8 GEMV's L2 heads prefetch (Switches.l2_heads, gemv_q8g_loads._l2_heads) in its sm_90
build, compiled here (no GPU): one bulk L2 prefetch per plane of the next GEMV, issued after the
program's own weight loads and before its PDL wait, and nothing else of the kernel changed (the same
dp4a and loads as the build without it)."""

from __future__ import annotations

import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]
q4 = ["*i32", "*i16", "*i32", "*i32"]
arg = json.loads(sys.argv[1])
types = q4 * 2 + arg["tail"]
out = {}
for name, hpf in arg["cases"].items():
    # the 7B's o launch: [32, 16, 1, 8], one step before the wait, the residual epilogue with its q8 row
    cex = dict(QT=12, QTB=12, MIXED=False, BN=32, BB=16, NW=8, IS_SPLIT=False, HAS_BIAS=False, HAS_RESID=False,
               PDL=3, PF=False, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=True, RQ=2, WK=False, SF=False, TM=0, HPF=hpf)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    out[name] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
print(json.dumps(out))
"""


def test_heads_prefetch_build():
    from kernel_data import GEMV_Q8G_TAIL, sm90_builds

    ptx = sm90_builds(_COMPILE, {"tail": GEMV_Q8G_TAIL, "cases": {"off": 0, "3 planes": 3, "late": 11}})
    off, on, late = ptx["off"], ptx["3 planes"], ptx["late"]
    pf = "cp.async.bulk.prefetch.L2.global"
    assert off.count(pf) == 0 and on.count(pf) == 3

    def loads(text):
        return collections.Counter(re.findall(r"ld\.global[\w:.]*", text))
    # the same dp4a and the same loads: the ranges are kernel arguments (a CUDA graph keeps them), no table
    assert off.count("dp4a") == on.count("dp4a") > 0
    assert loads(on) == loads(off)
    # issued after the weights' first loads and before the PDL wait
    first_w = on.index("evict_first")
    assert first_w < on.index(pf) < on.index("griddepcontrol.wait")
    # Switches.l2_heads_late (HPF 8 + planes): the same prefetches after the last dot product, past the wait
    assert late.count(pf) == 3 and loads(late) == loads(off)
    assert late.index(pf) > late.rindex("dp4a") > late.index("griddepcontrol.wait")
