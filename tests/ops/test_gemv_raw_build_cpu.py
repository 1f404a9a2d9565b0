"""ops/cuda/gemv.py's raw-block GEMV through Triton's sm_90 compiler on this CPU machine (the build only,
kernel_data.sm90_builds) in the small models' one-row configs: the one-pass tile (K <= 1024 in one tile,
weights decoded before the PDL wait) and the split config, PDL on and off, for Q5_0 / Q8_0 / Q4_K, and the
halfword reads of Q4_0 / Q5_0 / Q8_0 (Switches.gemv_raw_halfwords) beside their byte builds. With PDL the PTX
must hold griddepcontrol's wait and launch_dependents (off: neither), and no build may spill registers to
local memory; the halfword builds hold no one-byte global load."""

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
from minfer.ops.cuda import gemv as G
from minfer.ops.cuda.dequant import LAYOUT

T = GPUTarget("cuda", 90, 32)
names = ["raw", "x", "out", "part", "bias", "M", "N", "K", "row_bytes", "stride_xm", "stride_om", "tiles_per_split",
         "nx", "ny", "ng", "s_out", "eps", "h_rn", "cnt", "rp", "rt", "kc", "vc", "nq", "nk", "kvs"]
types = ["*u8", "*bf16", "*bf16", "*fp32", "*fp32"] + ["i32"] * 7 + ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "*bf16",
                                                                    "*i32", "*i64", "*fp64", "*bf16", "*bf16", "i32",
                                                                    "i32", "i32"]
out = {}
for qt, qn in ((6, "Q5_0"), (8, "Q8_0"), (12, "Q4_K")):
    _, qk, ts = LAYOUT[qt]
    for one, bn, bk, split in ((True, 4, 1024, 1), (True, 8, 1024, 1), (False, 8, 256, 4)):
        for pdl in (0, 1):
            cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=bk, MP=1, SPLIT=split, HAS_BIAS=True, USE_DOT=False,
                       IEEE=False, PDL=pdl, ONE=one)
            sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
            k = triton.compile(ASTSource(G._gemv_kernel, sig, cex), target=T, options={"num_warps": 4})
            ptx = k.asm["ptx"]
            out[f"{qn}_{'one' if one else 'split'}_{bn}_{pdl}"] = [ptx.count("st.local"),
                                                                 "griddepcontrol.wait" in ptx,
                                                                 "griddepcontrol.launch_dependents" in ptx]
# the one-pass tile with the norm prologue (Switches.gemv_raw_norm): Q5_0 / Q8_0, PDL on and off
for qt, qn in ((6, "Q5_0"), (8, "Q8_0")):
    _, qk, ts = LAYOUT[qt]
    for bn in (4, 8):
        for pdl in (0, 1):
            cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=1024, MP=1, SPLIT=1, HAS_BIAS=True, USE_DOT=False,
                       IEEE=False, PDL=pdl, ONE=True, NORM=True)
            sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
            k = triton.compile(ASTSource(G._gemv_kernel, sig, cex), target=T, options={"num_warps": 4})
            ptx = k.asm["ptx"]
            out[f"{qn}_norm_{bn}_{pdl}"] = [ptx.count("st.local"), "griddepcontrol.wait" in ptx,
                                            "griddepcontrol.launch_dependents" in ptx, ptx.count("st.global"),
                                            ptx.count("sqrt")]
# the halfword reads (Switches.gemv_raw_halfwords): Q4_0 / Q5_0 / Q8_0, the one-pass tiles and the split config
import re
for qt, qn in ((2, "Q4_0"), (6, "Q5_0"), (8, "Q8_0")):
    _, qk, ts = LAYOUT[qt]
    for one, bn, bk, split in ((True, 4, 1024, 1), (True, 8, 1024, 1), (False, 8, 256, 4)):
        for pdl in (0, 1):
            for hw in (False, True):
                cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=bk, MP=1, SPLIT=split, HAS_BIAS=True, USE_DOT=False,
                           IEEE=False, PDL=pdl, ONE=one, HW=hw)
                sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
                k = triton.compile(ASTSource(G._gemv_kernel, sig, cex), target=T, options={"num_warps": 4})
                ptx = k.asm["ptx"]
                out[f"{qn}_{'one' if one else 'split'}_{bn}_hw{int(hw)}_{pdl}"] = [
                    ptx.count("st.local"), "griddepcontrol.wait" in ptx, "griddepcontrol.launch_dependents" in ptx,
                    len(re.findall(r"ld\.global(?:\.nc)?\.(?:v\d\.)?b8", ptx)), len(re.findall(r"ld\.global", ptx))]
# the residual norm epilogue (Switches.gemv_raw_resnorm): the one-pass tiles, Q5_0 / Q8_0, bytes and halfwords
for qt, qn in ((6, "Q5_0"), (8, "Q8_0")):
    _, qk, ts = LAYOUT[qt]
    for bn in (4, 8):
        for pdl in (0, 1):
            for hw in (False, True):
                cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=1024, MP=1, SPLIT=1, HAS_BIAS=False, USE_DOT=False,
                           IEEE=False, PDL=pdl, ONE=True, HW=hw, RN=True, BD=1024)
                sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
                k = triton.compile(ASTSource(G._gemv_kernel, sig, cex), target=T, options={"num_warps": 4})
                ptx = k.asm["ptx"]
                out[f"{qn}_rn_{bn}_hw{int(hw)}_{pdl}"] = [
                    ptx.count("st.local"), "griddepcontrol.wait" in ptx, "griddepcontrol.launch_dependents" in ptx,
                    len(re.findall(r"atom\.[\w.]*acq_rel[\w.]*\.add|atom\.acq_rel[\w.]*\.add", ptx)),
                    ptx.count("sqrt")]
# the rope epilogue (Switches.gemv_raw_rope): the one-pass tiles, Q5_0 / Q8_0, neox / normal pairs, halfwords
for qt, qn in ((6, "Q5_0"), (8, "Q8_0")):
    _, qk, ts = LAYOUT[qt]
    for bn in (4, 8):
        for rp in (1, 2):
            for pdl in (0, 1):
                cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=1024, MP=1, SPLIT=1, HAS_BIAS=True, USE_DOT=False,
                           IEEE=False, PDL=pdl, ONE=True, HW=True, RP=rp, HD=64)
                sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
                k = triton.compile(ASTSource(G._gemv_kernel, sig, cex), target=T, options={"num_warps": 4})
                ptx = k.asm["ptx"]
                # (the cosine and sine are libdevice's, whose range reduction keeps a 32-byte local array: st.local
                # here is no spill, so ptxas's own spill count is read)
                import os, subprocess, tempfile
                with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                    f.write(ptx)
                ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
                r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
                os.unlink(f.name)
                out[f"{qn}_rope{rp}_{bn}_{pdl}"] = [
                    int((re.findall(r"(\d+) bytes spill stores", r.stderr) or ["-1"])[0]), "griddepcontrol.wait" in ptx,
                    "griddepcontrol.launch_dependents" in ptx, len(re.findall(r"sin|cos", ptx)),
                    len(re.findall(r"st\.global", ptx))]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, None)


def test_raw_gemv_builds_for_sm90(builds):
    assert len(builds) == 18 + 8 + 36 + 16 + 16, builds
    for name, (spills, wait, signal, *_) in builds.items():
        assert spills == 0, (name, spills)
        pdl = name.endswith("_1")
        assert wait == pdl and signal == pdl, (name, wait, signal)


def test_norm_prologue_builds_with_its_stores(builds):
    """The norm prologue's builds (the one-pass tile only): no spills, the PDL markers as the others,
    a square root, and stores beyond the plain build's output store (s and h from program 0)."""
    for name in [n for n in builds if "_norm_" in n]:
        spills, wait, signal, stores, sqrt = builds[name]
        plain = builds[name.replace("_norm_", "_one_")]
        assert spills == 0 and sqrt > 0, (name, builds[name])
        assert stores > 0 and wait == plain[1] and signal == plain[2], (name, builds[name], plain)


def test_halfword_builds_read_no_single_bytes(builds):
    """The halfword builds (Switches.gemv_raw_halfwords) issue fewer global loads than the byte builds of the
    same config, and no one-byte load but Q5_0's two qh bytes a run (1/16 of the byte build's 32 a run: one
    uint16 qh load miscompiled on the GPU, perf-log AZ1)."""
    hw = [n for n in builds if "_hw1_" in n and "_rn_" not in n]
    assert len(hw) == 18
    for name in hw:
        spills, wait, signal, b8, loads = builds[name]
        _, _, _, b8_old, loads_old = builds[name.replace("_hw1_", "_hw0_")]
        ok = b8 * 16 == b8_old if name.startswith("Q5_0") else b8 == 0
        assert ok and b8_old > 0 and loads < loads_old, (name, builds[name], builds[name.replace("_hw1_", "_hw0_")])


def test_resnorm_builds_hold_the_ticket(builds):
    """The residual norm epilogue's builds (Switches.gemv_raw_resnorm): no spills, the PDL markers as the
    plain builds, one acq_rel atomic add (the ticket) and a square root (the last program's norm)."""
    rn = [n for n in builds if "_rn_" in n]
    assert len(rn) == 16
    for name in rn:
        spills, wait, signal, atom, sqrt = builds[name]
        assert spills == 0 and atom >= 1 and sqrt >= 1, (name, builds[name])


def test_rope_builds_rotate_and_store(builds):
    """The rope epilogue's builds (Switches.gemv_raw_rope): no spills (ptxas's count), the PDL markers as the plain
    builds (test_raw_gemv_builds_for_sm90), the rotation's cosine and sine, and the two stores of a pair's values."""
    rope = [n for n in builds if "_rope" in n]
    assert len(rope) == 16
    for name in rope:
        spills, wait, signal, trig, stores = builds[name]
        assert spills == 0 and trig >= 2 and stores >= 2, (name, builds[name])
