"""Switches.pdl_preload on the sm_90 builds (no GPU): with PRE the norm + q8 kernel issues its
norm-weight loads, and the Gluon q8 GEMV its bias loads, before griddepcontrol.wait; without PRE
they come after it. Switches.decode_attn_preload: the decode attention's key count likewise;
decode_attn_kvpre: its first tile of cached keys and values too.
Built in a fresh interpreter without TRITON_INTERPRET (tests/conftest.py sets it on a machine
without a GPU; Gluon's compiler then refuses the kernel's helpers)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import DECODE_ATTN_SIG, sm90_builds  # noqa: E402

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import q8_rows as Q
from minfer.ops.cuda import gemv_q8_gluon as GL
import importlib
A = importlib.import_module("minfer.ops.cuda.attention")   # (the package exports a function of that name)

T = GPUTarget("cuda", 90, 32)
ATTN_SIG = json.loads(sys.argv[1])
out = {}
for pre in (0, 1):
    names = ["x", "y", "up", "nw", "s_out", "h_out", "xq", "xf", "K", "eps"]
    types = ["*fp32", "*bf16", "*fp32", "*fp32", "*fp32", "*bf16", "*i32", "*fp32", "i32", "fp32"]
    cex = dict(ADD=True, NORM=True, SWIGLU=False, CB=16, BK=4096, PDL=1, PRE=bool(pre))
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    k = triton.compile(ASTSource(Q._q8_kernel, sig, cex), target=T, options={"num_warps": 4})
    out[f"norm {pre}"] = k.asm["ptx"]
    names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]   # the runtime arguments
    planes = ["*i32", "*i16", "*i32", "*i32"]
    types = planes + planes + ["*i32", "*fp32", "*bf16", "*fp32", "*bf16", "*fp32", "*i32"] + ["i32"] * 6 + \
        ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32", "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    cex = dict(QT=12, QTB=12, MIXED=False, BN=32, BB=2, NW=4, IS_SPLIT=True, HAS_BIAS=True, HAS_RESID=False,
               PDL=1, PF=True, PRE=bool(pre), NORM=0, KP2=1, NCHP=1, RSS=False)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    k = triton.compile(src, target=T, options={"num_warps": 4})
    out[f"gemv {pre}"] = k.asm["ptx"]
    if pre:
        src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex | {"TL": True},
                             {(i,): [["tt.divisibility", 16]] for i in range(15)})
        out["gemv tl"] = triton.compile(src, target=T, options={"num_warps": 4}).asm["ptx"]
    names, types = zip(*ATTN_SIG)
    for kv in ((0, 1) if pre else (0,)):
        cex = dict(D=128, BD=128, GP=16, BS=64, IEEE=False, PDL=1, CAP=False, PRE=bool(pre), KVPRE=bool(kv),
                   VS=1)
        sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
        k = triton.compile(ASTSource(A._decode_attn_kernel, sig, cex), target=T, options={"num_warps": 4})
        out[f"attn {pre + kv}"] = k.asm["ptx"]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx():
    return sm90_builds(_COMPILE, DECODE_ATTN_SIG)


def _loads_before_wait(src: str) -> int:
    head = src[:src.index("griddepcontrol.wait")]
    return head.count("ld.global")


@pytest.mark.parametrize("kernel", ["norm", "gemv", "attn"])
def test_preload_moves_the_independent_loads_before_the_wait(ptx, kernel):
    off, on = ptx[f"{kernel} 0"], ptx[f"{kernel} 1"]
    assert off.count("griddepcontrol.wait") == 1 and on.count("griddepcontrol.wait") == 1
    if kernel in ("norm", "attn"):
        assert _loads_before_wait(off) == 0          # nothing before the wait without PRE
    if kernel == "attn":
        assert _loads_before_wait(on) == 1           # the key count, only
    assert _loads_before_wait(on) > _loads_before_wait(off)
    # the same loads in all: only their place moves
    assert on.count("ld.global") == off.count("ld.global")


def test_kvpre_loads_the_first_tile_before_the_wait(ptx):
    """Switches.decode_attn_kvpre: the key count and the first tile of cached keys and values
    (64 x 128 bf16 each: at least 8 vector loads a thread for each) before griddepcontrol.wait."""
    kv = ptx["attn 2"]
    assert kv.count("griddepcontrol.wait") == 1
    assert _loads_before_wait(kv) >= 1 + 2 * 8
    assert _loads_before_wait(ptx["attn 1"]) == 1


def test_timeline_stamps_only_when_asked(ptx):
    """ops/cuda/timeline.py: the TL build reads the global timer three times (start, past the PDL
    wait, end) and the SM id once, and stores them; otherwise it is the plain build (the same
    loads, dp4a and wait). The plain build reads neither."""
    plain, tl_ = ptx["gemv 1"], ptx["gemv tl"]
    assert plain.count("%globaltimer") == 0 and plain.count("%smid") == 0
    assert tl_.count("%globaltimer") == 3 and tl_.count("%smid") == 1
    assert tl_.count("dp4a") == plain.count("dp4a") > 0
    assert tl_.count("ld.global") == plain.count("ld.global")
    assert tl_.count("griddepcontrol.wait") == plain.count("griddepcontrol.wait") == 1
    assert tl_.count("st.global") > plain.count("st.global")
