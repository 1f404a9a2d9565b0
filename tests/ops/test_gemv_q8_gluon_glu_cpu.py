"""The Gluon q8 GEMV's SwiGLU epilogue (gemv_q8g_norm._glu_pair, gemv_q8.gemv_q8_swiglu with
gluon=True) without a GPU: the kernel builds for sm_90 (Gluon has no interpreter: its numbers
are checked in tests/gpu/test_gemv_q8_gpu.py), and gemv_q8_swiglu routes each launch to the
Gluon kernel, or to the Triton kernel (interpreted here) counting a fallback, as gemv_q8 does.
The Gluon launch itself is replaced by a recorder in the routing tests."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err, sm90_builds  # noqa: E402

from minfer.errors import MinferError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


# ---------------------------------------------------------------- the kernel builds (sm_90, no GPU)

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = ["p0", "p1", "p2", "p3", "xq", "xf", "h", "part", "cnt", "gq", "gf", "TF", "N", "NB", "blocks", "tlb"]
out = {}
for qt, bn, bb, pdl, *gp in json.loads(sys.argv[1]):
    planes = ["*i32", "*i16", "*i32", "*i32"] if qt == 12 else ["*i32", "*i16", "*i16", "*fp16"]   # kernel_planes
    types = planes + ["*i32", "*fp32", "*bf16", "*fp32", "*i32", "*i32", "*fp32", "i32", "i32", "i32", "i32", "*bf16"]
    cex = dict(QT=qt, BN=bn, BB=bb, NW=8 if gp else 4, PDL=pdl, PF=True, GP=bool(gp))
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_glu_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(11)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8 if gp else 4})
    out[" ".join(map(str, [qt, bn, bb, pdl, *gp]))] = {"ptx": k.asm["ptx"], "cubin": len(k.asm["cubin"])}
print(json.dumps(out))
"""

_CASES = [(qt, bn, bb, pdl) for qt in (12, 14) for bn, bb in ((32, 1), (64, 2)) for pdl in (1, 3)]
_PAIRED = [(12, 64, 1, 1, 1), (14, 64, 1, 1, 1), (12, 128, 1, 3, 1)]     # Switches.gemv_swiglu 2: 8 warps


@pytest.fixture(scope="module")
def built():
    """The GLU kernel's sm_90 builds, in a fresh interpreter without TRITON_INTERPRET:
    tests/conftest.py sets it on a machine without a GPU, and Gluon's compiler then refuses the
    kernel's helper functions (the interpreter wraps them)."""
    return sm90_builds(_COMPILE, _CASES + _PAIRED)


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{'Q4_K' if c[0] == 12 else 'Q6_K'}-{c[1]}x{c[2]}-pdl{c[3]}")
def test_glu_kernel_compiles_for_sm90(built, case):
    """The 7B's gate+up tile (32 rows x 1 block, 4 warps, prefetch, PDL) and 64 x 2 build to
    sm_90 PTX with the pair protocol: the ticket an acq_rel add at GPU scope, the reset an
    exchange, each once; with the late signal (PDL 3, Switches.pdl_late) the next kernel's
    launch after them."""
    k = built[" ".join(map(str, case))]
    ptx = k["ptx"]
    assert ptx.count("atom.global.gpu.acq_rel.add") == 1 and ptx.count(".exch.") == 1, ptx[-3000:]
    assert ptx.count("griddepcontrol.wait") == 1 and ptx.count("griddepcontrol.launch_dependents") == 1
    if case[3] == 3:
        assert ptx.index("griddepcontrol.launch_dependents") > ptx.rindex(".exch.")
    else:
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("atom.global.gpu.acq_rel.add")
    assert k["cubin"] > 0


@pytest.mark.parametrize("case", _PAIRED, ids=lambda c: f"{'Q4_K' if c[0] == 12 else 'Q6_K'}-{c[1]}x{c[2]}-pdl{c[3]}")
def test_paired_glu_kernel_has_no_ticket(built, case):
    """The paired build (GP: a tile's first half gate rows, second half the up rows of the same h
    values, Switches.gemv_swiglu 2): no atomic and no exchange -- the epilogue is the program's own
    (_glu_local), its row sums parked and read back (.cg) after one barrier -- and it stores h, the
    q8 words and scales as the ticketed build does (bf16 h, int32 words, float32 scales)."""
    k = built[" ".join(map(str, case))]
    ptx = k["ptx"]
    assert "atom" not in ptx and ".exch." not in ptx
    assert ptx.count("griddepcontrol.wait") == 1 and "bar.sync" in ptx and "ld.global.cg" in ptx
    assert "st.global.b16" in ptx and "st.global.b32" in ptx and "dp4a" in ptx
    assert k["cubin"] > 0


# ---------------------------------------------------------------- routing (Triton kernel interpreted)

@pytest.fixture(scope="module")
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8"]):
        yield mods["gemv_q8"], mods["gemv_repack"]


F, K = 256, 512                                      # 2F = 512 stacked rows, 2 blocks


@pytest.fixture(scope="module")
def pair(Q):
    q8m, G = Q
    raw = random_weight(12, 2 * F, K, np.random.default_rng(3))
    rw = G.repack(torch.from_numpy(raw), 12, 2 * F, K)
    w = torch.from_numpy(reference_dequant(raw, 12, 2 * F, K)).double()
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(2)).bfloat16()
    q8 = q8m.quantize(x, interpret=True)
    # the Triton kernel's result (interpreter) that every Triton route below must reproduce
    h, hq = q8m.gemv_q8_swiglu(q8, rw, config=(32, 2, 1, 4, True), interpret=True)
    gu = q8m.dequantize_q8(q8, K).double() @ w.T
    # 2e-2: the interpreter truncates float32 -> bf16 (round to nearest on the GPU)
    assert rel_err(h.float(), torch.nn.functional.silu(gu[:, :F]) * gu[:, F:]) < 2e-2
    return rw, q8, h, hq


class _Recorder:
    """Stands for gemv_q8_gluon.launch_swiglu: records its arguments, launches nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, rw, xq, xf, h, part, cnt, gq, gf, bn, bb, nwarps, pdl, prefetch=True, late=False, regs=0,
                 paired=False):
        self.calls.append(dict(rw=rw, xq=xq, xf=xf, h=h, part=part, cnt=cnt, gq=gq, gf=gf, bn=bn, bb=bb,
                               nwarps=nwarps, pdl=pdl, prefetch=prefetch, late=late, regs=regs))


@pytest.fixture()
def gl_mod(monkeypatch):
    """gemv_q8_gluon with an sm_90 device (whatever the tensors' device) and a recording launch."""
    from minfer.ops.cuda import gemv_q8_gluon as GL

    rec = _Recorder()
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "launch_swiglu", rec)
    return GL, rec


def _counts():
    from minfer.ops import paths

    s = paths.snapshot()
    return s["counts"], s["fallbacks"]


def _same(a, b):
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_interpreter_keeps_the_triton_kernel(Q, pair, gl_mod):
    """interpret=True: gluon=True is ignored (no Gluon interpreter), no fallback counted."""
    from minfer.ops import paths

    q8m, _ = Q
    rw, q8, h, hq = pair
    _, rec = gl_mod
    paths.reset()
    out = q8m.gemv_q8_swiglu(q8, rw, config=(32, 2, 1, 4, True), interpret=True, gluon=True)
    counts, falls = _counts()
    assert counts == {"gemv_q8.triton": 1} and not falls and not rec.calls
    assert _same(out, (h, hq))


def test_explicit_and_tabled_configs_take_the_gluon_kernel(Q, pair, gl_mod, monkeypatch):
    """A config given (SPLIT ignored) or found in the Gluon table goes to launch_swiglu with its
    tile, warps and prefetch flag, the pair counters and the output buffers sized for F."""
    from minfer.ops import paths

    q8m, G = Q
    rw, q8, _, _ = pair
    GL, rec = gl_mod
    ws = G.GemvWorkspace("cpu")
    paths.reset()
    q8m.gemv_q8_swiglu(q8, rw, config=(32, 1, 3, 4), interpret=False, gluon=True, ws=ws, pdl=1)
    monkeypatch.setattr(GL, "config_for", lambda qtype, n, k, table="": (64, 2, 1, 8, False) if (n, k) == (2 * F, K) else None)
    h, (gq, gf) = q8m.gemv_q8_swiglu(q8, rw, interpret=False, gluon=True)
    counts, falls = _counts()
    assert counts == {"gemv_q8.gluon": 2} and not falls
    a, b = rec.calls
    assert (a["bn"], a["bb"], a["nwarps"], a["prefetch"], a["pdl"]) == (32, 1, 4, True, 1)
    assert (b["bn"], b["bb"], b["nwarps"], b["prefetch"], b["pdl"]) == (64, 2, 8, False, 0)
    assert a["cnt"] is ws.cnt and a["cnt"].numel() >= F // 32 and b["cnt"].numel() == F // 64
    assert b["h"] is h and b["gq"] is gq and b["gf"] is gf and b["rw"] is rw and b["xq"] is q8[0]
    assert h.shape == (1, F) and gq.shape == (F // 4,) and gf.shape == (F // 8,) and b["part"].shape == (2 * F,)


def test_unpaired_or_unsupported_gluon_tiles_fall_back(Q, pair, gl_mod, monkeypatch):
    """A Gluon config whose tile does not pair the halves (16 rows: the table's tile of the 7B's
    gate alone), or a GPU the Gluon kernel refuses: a gemv_q8.gluon fallback naming why, and the
    Triton kernel (its own table's config, or the config given) with the Triton result."""
    from minfer.ops import paths

    q8m, _ = Q
    rw, q8, h, hq = pair
    GL, rec = gl_mod
    paths.reset()
    monkeypatch.setattr(GL, "config_for", lambda qtype, n, k, table="": (16, 2, 1, 2))
    out = q8m.gemv_q8_swiglu(q8, rw, interpret=False, asm=False, gluon=True)
    counts, falls = _counts()
    assert counts == {"gemv_q8.triton": 1} and not rec.calls
    assert list(falls) == [f"gemv_q8.gluon (fell back because 16-row tiles do not pair the gate/up halves of {F} "
                           "rows)"], falls
    # Triton's own config for this shape (default_config: 32 x 2, prefetch) is the fixture's
    assert q8m.config_for(12, 2 * F, K)[:2] == (32, 2) and _same(out, (h, hq))
    paths.reset()
    monkeypatch.setattr(GL, "device_unsupported", lambda device: "the GPU is sm_80")
    out = q8m.gemv_q8_swiglu(q8, rw, config=(32, 2, 1, 4, True), interpret=False, asm=False, gluon=True)
    counts, falls = _counts()
    assert counts == {"gemv_q8.triton": 1} and list(falls) == ["gemv_q8.gluon (fell back because the GPU is sm_80)"]
    assert _same(out, (h, hq)) and not rec.calls


def test_untabled_shape_l2_ranges_and_gluon_off_keep_triton_silently(Q, pair, gl_mod, monkeypatch):
    """No Gluon config for the shape, l2 ranges asked for, or gluon=False: the Triton kernel,
    no fallback counted (as gemv_q8)."""
    from minfer.ops import paths

    q8m, _ = Q
    rw, q8, h, hq = pair
    GL, rec = gl_mod
    paths.reset()
    monkeypatch.setattr(GL, "config_for", lambda qtype, n, k, table="": None)
    out1 = q8m.gemv_q8_swiglu(q8, rw, interpret=False, asm=False, gluon=True)
    monkeypatch.setattr(GL, "config_for", lambda qtype, n, k, table="": (32, 1, 1, 4))
    out2 = q8m.gemv_q8_swiglu(q8, rw, config=(32, 2, 1, 4, True), interpret=False, asm=False, gluon=True,
                              l2=(1 << 20, 0, False))
    out3 = q8m.gemv_q8_swiglu(q8, rw, config=(32, 2, 1, 4, True), interpret=False, asm=False, gluon=False)
    counts, falls = _counts()
    assert counts == {"gemv_q8.triton": 3} and not falls and not rec.calls
    assert all(_same(o, (h, hq)) for o in (out1, out2, out3))


def test_bad_pairs_are_refused_before_any_launch(Q, pair, gl_mod):
    """A tile that does not pair (given with gluon on: neither kernel can take it) raises, and
    counts neither a launch nor a fallback."""
    from minfer.ops import paths

    q8m, _ = Q
    rw, q8, _, _ = pair
    _, rec = gl_mod
    paths.reset()
    with pytest.raises(MinferError, match="gate; up"):
        q8m.gemv_q8_swiglu(q8, rw, config=(16, 2, 1, 4, True), interpret=False, asm=False, gluon=True)
    assert _counts() == ({}, {}) and not rec.calls


def test_gluon_table_switch_reads_another_table(tmp_path):
    """Switches.gemv_q8g_table (MINFER_GEMV_Q8G_TABLE): config_for reads the named file instead of
    the shipped table, and a file that is not a table is refused with its name."""
    import json

    import pytest

    from minfer.errors import MinferError
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.switches import Switches

    f = tmp_path / "t.json"
    f.write_text(json.dumps({"configs": {"Q4_K 3584x3584": [16, 8, 3, 4, False]}}))
    assert GL.config_for(12, 3584, 3584, str(f)) == (16, 8, 3, 4, False)
    assert GL.config_for(12, 4608, 3584, str(f)) is None            # only the file's shapes
    assert GL.config_for(12, 3584, 3584) == GL.CONFIGS.get("Q4_K 3584x3584")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(MinferError, match="bad.json"):
        GL.config_for(12, 3584, 3584, str(bad))
    assert Switches.from_env({"MINFER_GEMV_Q8G_TABLE": str(f)}).gemv_q8g_table == str(f)
