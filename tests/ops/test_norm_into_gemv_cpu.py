"""Switches.norm_into_gemv without a GPU: the decode row's add + RMSNorm + q8 deferred to the q/k/v
GEMV (norm_rope_act.add_rms_norm with into_linear, q8_rows.PreNorm, gemv_q8's prenorm). In the
interpreter the Gluon kernel never runs, so the GEMV runs the deferred norm kernel first (counted
as a fallback) and must give bit for bit the two-launch result; other consumers materialize the
norm too; the Gluon kernel's NORM variant builds for sm_90 (its numbers: tests/gpu)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, sm90_builds  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows",
                                     "minfer.ops.cuda.gemv_q8", "minfer.ops.cuda.norm_rope_act",
                                     "minfer.ops.cuda.qmatmul"]):
        yield mods


def _qweight(raw, qt, n, k):
    from minfer.weights import QWeight

    return QWeight(name="blk.0.ffn_down.weight", qtype=qt, shape=(n, k), raw=raw)


def _row(k, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, k, generator=g) * 3, torch.randn(1, k, generator=g).to(torch.bfloat16),
            torch.rand(k, generator=g) + 0.5)


def test_deferred_norm_then_gemv_is_the_two_launches(M):
    """add_rms_norm(into_linear) under the switch returns s and h unwritten, h.prenorm set; the
    GEMV (interpreter: Triton) runs the norm kernel first -- a counted fallback -- and gives the
    bits of add_rms_norm_q8 + gemv_q8, with s (the next residual) and h written."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    G, Q, N = M["gemv_repack"], M["gemv_q8"], M["norm_rope_act"]
    k = 512
    ra = G.repack(torch.from_numpy(random_weight(12, 40, k, np.random.default_rng(3))), 12, 40, k)
    rb = G.repack(torch.from_numpy(random_weight(14, 24, k, np.random.default_rng(4))), 14, 24, k)
    x, y, w = _row(k, 5)
    s0, h0, q80 = Q.add_rms_norm_q8(x, y, w, 1e-6, torch.bfloat16, interpret=True)
    ref = Q.gemv_q8(q80, (ra, rb), out_dtype=torch.float32, interpret=True)
    paths.reset()
    ctx = Context(Switches(norm_into_gemv=1), None)
    s, h = N.add_rms_norm(x, y, w, 1e-6, torch.bfloat16, ctx, into_linear=True)
    pre = h.prenorm
    assert pre.q8 is None and getattr(h, "q8", None) is None
    out = Q.gemv_q8(None, (ra, rb), out_dtype=torch.float32, interpret=True, gluon=True, prenorm=pre)
    assert torch.equal(out, ref) and torch.equal(s, s0) and torch.equal(h, h0)
    assert torch.equal(h.q8[0], q80[0]) and torch.equal(h.q8[1], q80[1])
    snap = paths.snapshot()
    assert snap["counts"].get("add_rms_norm.into_gemv") == 1 and snap["counts"].get("gemv_q8.triton") == 1
    assert any(k_.startswith("gemv_q8.norm_prologue (fell back because the Triton kernel") for k_ in snap["fallbacks"]), snap["fallbacks"]
    # a second consumer finds the norm done: no second launch of it
    q8b = pre.materialize()
    assert q8b is h.q8


def test_switch_off_or_not_into_linear_keeps_the_norm_kernel(M):
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    N = M["norm_rope_act"]
    x, y, w = _row(256, 7)
    paths.reset()
    for sw, into in ((Switches(norm_into_gemv=0), True), (Switches(norm_into_gemv=1), False)):
        s, h = N.add_rms_norm(x, y, w, 1e-6, torch.bfloat16, Context(sw, None), into_linear=into)
        assert getattr(h, "prenorm", None) is None and h.q8 is not None
    snap = paths.snapshot()
    assert snap["counts"].get("add_rms_norm.q8") == 2 and "add_rms_norm.into_gemv" not in snap["counts"]
    assert any("MINFER_NORM_INTO_GEMV" in k_ for k_ in snap["switched_off"]), snap["switched_off"]
    # modes 4 and 5 (5 the default) leave the norm to the GEMV before, not to this kernel's consumer:
    # this kernel runs, nothing deferred, nothing switched off
    paths.reset()
    for mode in (4, 5):
        s, h = N.add_rms_norm(x, y, w, 1e-6, torch.bfloat16, Context(Switches(norm_into_gemv=mode), None),
                              into_linear=True)
        assert getattr(h, "prenorm", None) is None and h.q8 is not None
    snap = paths.snapshot()
    assert snap["counts"] == {"add_rms_norm.q8": 2} and not snap["switched_off"], snap


def test_gemv_q8_refuses_a_deferred_row_of_the_wrong_length(M):
    from minfer.errors import MinferError
    from minfer.ops.cuda.q8_rows import PreNorm

    G, Q = M["gemv_repack"], M["gemv_q8"]
    rw = G.repack(torch.from_numpy(random_weight(12, 16, 512, np.random.default_rng(1))), 12, 16, 512)
    x, y, w = _row(256, 1)
    pre = PreNorm(x, y, w, 1e-6, torch.empty(1, 256), torch.empty(1, 256, dtype=torch.bfloat16), True, 0, True,
                  True)
    with pytest.raises(MinferError, match=r"deferred norm's row has shape \(1, 256\).*\(1, 512\)"):
        Q.gemv_q8(None, rw, prenorm=pre, interpret=True)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]   # the runtime arguments
q4 = ["*i32", "*i16", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
out = {}
for key, qt, mixed, bn, bb, pf, nchp, norm, rss in json.loads(sys.argv[1]):
    first = q4 if qt == 12 else q6
    types = first + (q6 if mixed else first) + ["*i32", "*fp32", "*fp32", "*fp32", "*bf16", "*fp32", "*i32"] + \
        ["i32"] * 6 + ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32",
                       "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    cex = dict(QT=qt, QTB=14 if mixed else qt, MIXED=bool(mixed), BN=bn, BB=bb, NW=4, IS_SPLIT=True,
               HAS_BIAS=bool(mixed), HAS_RESID=False, PDL=1, PF=bool(pf), PRE=True, NORM=norm,
               KP2={0: 1, 1: 4096, 2: 256}[norm], NCHP=nchp if norm else 1, RSS=bool(rss), TAIL=rss == 2)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out[key] = k.asm["ptx"]
    out[key + " cubin"] = k.asm["cubin"].hex()
    out[key + " smem"] = k.metadata.shared
print(json.dumps(out))
"""

# (key, type, mixed, BN, BB, prefetch, NCHP, NORM, RSS): the shipped q/k/v config (4 blocks a
# split: 32 chunks) and one step of 16 blocks (128 chunks), plain and with each norm mode; the
# down projections (Q4_K and Q6_K) plain and with the residual epilogue
_CASES = [(f"{mixed} {bn} {bb} {pf} {norm}", 12, mixed, bn, bb, pf, nchp, norm, 0)
          for mixed, bn, bb, pf, nchp in ((1, 32, 2, 1, 32), (0, 8, 16, 0, 128)) for norm in (0, 1, 2)]
_CASES += [(f"down {qt} {rss}", qt, 0, 16, 2, 1, 1, 0, rss) for qt in (12, 14) for rss in (0, 1, 2)]


@pytest.fixture(scope="module")
def ptx():
    return sm90_builds(_COMPILE, _CASES, timeout=900)


@pytest.mark.parametrize("mixed,bn,bb,pf", [(1, 32, 2, 1), (0, 8, 16, 0)])
def test_norm_variant_builds_and_reads_the_row_not_the_q8_form(ptx, mixed, bn, bb, pf):
    """The NORM build waits as the plain one does, reads the residual row (more global loads: the
    whole row for the sum of squares, then its chunks' values, norm weights and the GEMV output),
    stores the residual from one program (a predicated store the plain build has not), keeps its
    q8 row in shared memory (at least the words and scales of its chunks: 44 bytes a chunk) and
    the same dp4a count as the plain build (the same dot products)."""
    plain, norm = ptx[f"{mixed} {bn} {bb} {pf} 0"], ptx[f"{mixed} {bn} {bb} {pf} 1"]
    nchp = 32 if bb == 2 else 128
    assert ptx[f"{mixed} {bn} {bb} {pf} 1 smem"] >= 44 * nchp
    assert norm.count("griddepcontrol.wait") == plain.count("griddepcontrol.wait") > 0
    assert norm.count("ld.global") > plain.count("ld.global")
    assert norm.count("st.global") > plain.count("st.global")
    assert norm.count("dp4a") == plain.count("dp4a") > 0


@pytest.mark.parametrize("mixed,bn,bb,pf", [(1, 32, 2, 1), (0, 8, 16, 0)])
def test_norm_from_tile_sums_builds(ptx, mixed, bn, bb, pf):
    """NORM 2 (the residual and its per-tile sums of squares from the GEMV before): the same
    dp4a count and shared q8 row as NORM 1, fewer global loads (no whole-row read of x and y) and
    no residual store (that GEMV stored it)."""
    one, two = ptx[f"{mixed} {bn} {bb} {pf} 1"], ptx[f"{mixed} {bn} {bb} {pf} 2"]
    plain = ptx[f"{mixed} {bn} {bb} {pf} 0"]
    assert two.count("dp4a") == plain.count("dp4a") > 0
    assert two.count("st.global") == plain.count("st.global") < one.count("st.global")
    assert two.count("ld.global") < one.count("ld.global")
    assert ptx[f"{mixed} {bn} {bb} {pf} 2 smem"] >= 44 * (32 if bb == 2 else 128)


@pytest.mark.parametrize("qt", [12, 14])
def test_residual_epilogue_builds(ptx, qt):
    """RSS (the down projection's epilogue: x + the rounded row sums stored, the tile's sum of
    squares stored): more stores and loads than the plain build, the same dot products."""
    plain, rss = ptx[f"down {qt} 0"], ptx[f"down {qt} 1"]
    assert rss.count("dp4a") == plain.count("dp4a") > 0
    assert rss.count("st.global") > plain.count("st.global")
    assert rss.count("ld.global") > plain.count("ld.global")


@pytest.mark.parametrize("qt", [12, 14])
def test_norm_tail_builds(ptx, qt):
    """TAIL (norm_into_gemv = 3): the RSS build plus one more ticket atomic, its reset, the tail's
    stores (h, the q8 words and scales), L2-only loads of what other programs stored (.cg), the
    same dot products, and no more registers than the RSS build needs plus a little (the tail runs
    after the K loop, whose registers are free then)."""
    import subprocess
    import tempfile

    rss, tail = ptx[f"down {qt} 1"], ptx[f"down {qt} 2"]
    assert tail.count("dp4a") == rss.count("dp4a") > 0
    assert tail.count("atom.global") >= rss.count("atom.global") + 2
    assert tail.count("st.global") > rss.count("st.global")
    assert tail.count("ld.global.cg") > rss.count("ld.global.cg")
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    regs = {}
    for key in (f"down {qt} 1", f"down {qt} 2"):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(bytes.fromhex(ptx[key + " cubin"]))
            f.flush()
            use = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        regs[key] = int(use.split("REG:")[1].split()[0])
    assert regs[f"down {qt} 2"] <= regs[f"down {qt} 1"] + 16, regs


# ---------------------------------------------------------------- mode 2: the residual from the down GEMV


def _down_and_norm(M, qt: int, seed: int, mode: int) -> tuple:
    """A layer's down projection (type qt, 512 -> 256) and the next norm on the CUDA code in the
    interpreter: ((s, h, q8) of gemv_q8 + add_rms_norm_q8, (s, h) of qmatmul.linear_add_rms_norm
    with norm_into_gemv = mode), path counts reset before the second."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    G, Q, qmatmul = M["gemv_repack"], M["gemv_q8"], M["qmatmul"]
    k, d = 512, 256
    raw = torch.from_numpy(random_weight(qt, d, k, np.random.default_rng(seed)))
    w = _qweight(raw, qt, d, k)
    w.repacked = G.repack(raw, qt, d, k)
    x, _, g = _row(d, seed + 1)
    a = torch.randn(1, k, generator=torch.Generator().manual_seed(seed + 2)).to(torch.bfloat16)
    a.q8 = Q.quantize(a, interpret=True)
    ref_y = Q.gemv_q8(a.q8, w.repacked, out_dtype=torch.bfloat16, interpret=True)
    ref = Q.add_rms_norm_q8(x, ref_y, g, 1e-6, torch.bfloat16, interpret=True)
    paths.reset()
    return ref, qmatmul.linear_add_rms_norm(a, w, x, g, 1e-6, torch.bfloat16, Context(Switches(norm_into_gemv=mode), None),
                                            into_linear=True)


def test_linear_add_rms_norm_falls_back_to_the_two_ops_bit_for_bit(M):
    """ops.linear_add_rms_norm on the CUDA code in the interpreter with norm_into_gemv = 2: the
    down GEMV's residual epilogue is Gluon-only, so it counts a fallback and runs the GEMV, then
    add_rms_norm (mode 1's deferral); the residual and, materialized, h and its q8 row are the
    bits of linear + add_rms_norm without the switch."""
    from minfer.ops import paths

    (s0, h0, q80), (s, h) = _down_and_norm(M, 12, 8, 2)
    snap = paths.snapshot()
    assert any(k_.startswith("qmatmul.residual_norm (fell back") for k_ in snap["fallbacks"]), snap
    assert snap["counts"].get("add_rms_norm.into_gemv") == 1
    q8 = h.prenorm.materialize()
    assert torch.equal(s, s0) and torch.equal(h, h0) and torch.equal(q8[0], q80[0]) and torch.equal(q8[1], q80[1])


def test_norm_tail_falls_back_to_the_norm_kernel_bit_for_bit(M):
    """norm_into_gemv = 3 in the interpreter (the tail is Gluon-only): a counted fallback, then the
    GEMV and the add + norm + q8 kernel itself -- not mode 1's deferral to the q/k/v programs -- so h
    arrives whole with its q8 row, the bits of linear + add_rms_norm without the switch."""
    from minfer.ops import paths

    (s0, h0, q80), (s, h) = _down_and_norm(M, 14, 18, 3)
    snap = paths.snapshot()
    assert any(k_.startswith("qmatmul.residual_norm (fell back") for k_ in snap["fallbacks"]), snap
    assert snap["counts"].get("add_rms_norm.q8") == 1 and "add_rms_norm.into_gemv" not in snap["counts"], snap
    assert getattr(h, "prenorm", None) is None
    assert torch.equal(s, s0) and torch.equal(h, h0) and torch.equal(h.q8[0], q80[0]) and torch.equal(h.q8[1], q80[1])


def test_prenorm_from_the_residual_materializes_the_norm_of_s(M):
    """A PreNorm whose x is the residual itself (y None, ssp set: mode 2) runs the norm kernel on
    s alone when a consumer cannot take it: h and its q8 row are rms_norm_cast's."""
    from minfer.ops.cuda.q8_rows import PreNorm

    Q = M["gemv_q8"]
    s, _, g = _row(512, 11)
    h = torch.empty((1, 512), dtype=torch.bfloat16)
    pre = PreNorm(s, None, g, 1e-6, s, h, True, 0, True, True, ssp=torch.zeros(4))
    q8 = pre.materialize()
    _, h0, q80 = M["q8_rows"]._q8_launch(s, None, None, g, 1e-6, torch.bfloat16, True)
    assert torch.equal(h, h0) and torch.equal(q8[0], q80[0]) and torch.equal(q8[1], q80[1])
    rw = M["gemv_repack"].repack(torch.from_numpy(random_weight(12, 32, 512, np.random.default_rng(2))), 12, 32, 512)
    pre2 = PreNorm(s, None, g, 1e-6, s, torch.empty_like(h), True, 0, True, True, ssp=torch.zeros(4))
    out = Q.gemv_q8(None, rw, out_dtype=torch.float32, interpret=True, gluon=True, prenorm=pre2)
    assert torch.equal(out, Q.gemv_q8(q80, rw, out_dtype=torch.float32, interpret=True))
