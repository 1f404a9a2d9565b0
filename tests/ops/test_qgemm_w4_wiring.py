"""Wiring of the Gluon w4 GEMM (ops/cuda/qgemm_w4_mma.py) on the CPU: the planes the batch engine
attaches (runtime/dense_planes.attach_w4_planes) and the rows qmatmul sends to it.

The Gluon kernel runs only on the GPU (tests/gpu/test_qgemm_w4_gpu.py checks it against these
planes' values). Here it is replaced by x @ dequantize_w4(planes)^T, so what is tested is
the choice of path, the launch counts, the group's column split and bias, and that the planes
hold the weights' values (against the gguf package, within the planes' bf16 scale rounding).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import ModelStub, interpreted_modules, qweights_with_reference, rel_err  # noqa: E402

pytest.importorskip("triton.experimental.gluon")


class _Stub(ModelStub):
    def decode_groups(self):
        return self.groups


@pytest.fixture(scope="module")
def QM():
    names = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8", "minfer.ops.cuda.gemv_repack",
             "minfer.ops.cuda.qmatmul"]
    for mods in interpreted_modules(names):
        yield mods


@pytest.fixture()
def model(monkeypatch):
    """gate/up (Q4_K) as a declared group, a Q6_K down and a small Q4_K o, repacked, with dense
    planes and w4 planes for every shape but o (use_w4 patched: the real rule takes the 7B's
    large shapes)."""
    from minfer.ops.cuda import gemv_repack_layout, qgemm_w4_mma
    from minfer.runtime.dense_planes import attach_dense_planes, attach_w4_planes

    monkeypatch.setattr(qgemm_w4_mma, "use_w4", lambda qt, n, k: n != 24)
    mk = qweights_with_reference([("blk.0.ffn_gate.weight", 12, 48, 512), ("blk.0.ffn_up.weight", 12, 48, 512),
                                  ("blk.0.ffn_down.weight", 14, 32, 512), ("blk.0.attn_output.weight", 12, 24, 512)],
                                 seed=8)
    ws = [w for w, _ in mk]
    grp = (ws[0], ws[1])
    m = _Stub(ws, [grp])
    m.act_dtype = torch.bfloat16                                        # dense planes in the rows' dtype
    gemv_repack_layout.repack_model(m)
    attach_dense_planes(m, force=True, free_bytes=1 << 30)
    got = attach_w4_planes(m)
    return m, mk, grp, got


def test_planes_attached_hold_the_weights(model):
    from minfer.ops.cuda.qgemm_w4 import dequantize_w4
    from minfer.runtime.dense_planes import w4_plane_bytes

    m, mk, grp, got = model
    gate, up, down, o = m.ws
    assert gate.batch_w4_group[0] == grp and getattr(up, "batch_w4", None) is None
    assert getattr(o, "batch_w4", None) is None and down.batch_w4 is not None
    assert got == gate.batch_w4_group[1].nbytes() + down.batch_w4.nbytes() == w4_plane_bytes(m)
    vals = dequantize_w4(gate.batch_w4_group[1]).double()
    ref = torch.cat([mk[0][1], mk[1][1]])
    assert vals.shape == ref.shape and rel_err(vals, ref) < 4e-3
    assert rel_err(dequantize_w4(down.batch_w4).double(), mk[2][1]) < 4e-3


def test_rows_take_the_w4_gemm_from_its_min_m_to_its_max_m(QM, model, monkeypatch):
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda import qgemm_w4_mma
    from minfer.ops.cuda.qgemm_w4 import dequantize_w4
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches

    calls = []

    def fake(x, p, bias=None, out_dtype=None, config=None, ws=None, ring=False):
        calls.append((x.shape[0], p.n))
        out = x.double() @ dequantize_w4(p).double().T
        return (out + (0 if bias is None else bias.double())).to(out_dtype or x.dtype)

    monkeypatch.setattr(qgemm_w4_mma, "qgemm_w4_mma", fake)
    qm = QM["qmatmul"]
    m, mk, grp, _ = model
    gate, up, down, o = m.ws
    ctx = Context(Switches(), Workspace("cpu", m.ws, [grp]))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, 512, generator=g).to(torch.bfloat16)
    bias = (None, torch.randn(48, generator=g))
    paths.reset()
    outs = qm.linear_many(x, grp, bias, ctx)
    assert paths.snapshot()["counts"] == {"qmatmul.group2.w4": 1} and calls == [(20, 96)]
    for (w, wref), out, b in zip(mk[:2], outs, bias):
        assert out.shape == (20, 48)
        assert rel_err(out, x.double() @ wref.T + (0 if b is None else b.double())) < 1e-2
    paths.reset()
    qm.linear(x, down, None, ctx)
    qm.linear(x, o, None, ctx)                                          # no w4 planes: the dense plane
    assert paths.snapshot()["counts"] == {"qmatmul.Q6_K.w4": 1, "qmatmul.Q4_K.dense_plane": 1}
    # from qgemm_w4_min_m (2) rows on, below dense_gemv_max_m too; not one row, not above qgemm_w4_max_m
    paths.reset()
    x2 = torch.randn(2, 512, generator=g).to(torch.bfloat16)
    qm.linear(x2, down, None, ctx)
    qm.linear_many(x2, grp, bias, ctx)
    assert paths.snapshot()["counts"] == {"qmatmul.Q6_K.w4": 1, "qmatmul.group2.w4": 1}
    paths.reset()
    qm.linear(torch.randn(40, 512, generator=g).to(torch.bfloat16), down, None, ctx)
    qm.linear(torch.randn(1, 512, generator=g).to(torch.bfloat16), down, None, ctx)
    qm.linear(torch.randn(4, 512, generator=g).to(torch.bfloat16), down, None,
              Context(Switches(qgemm_w4_min_m=5), Workspace("cpu", m.ws, [grp])))
    assert "qmatmul.Q6_K.w4" not in paths.snapshot()["counts"]
    # switched off (the dense plane instead), and float32 rows (not the bf16 plane either: the
    # GEMV): reported apart
    paths.reset()
    qm.linear(x, down, None, Context(Switches(qgemm_w4=False), Workspace("cpu", m.ws, [grp])))
    qm.linear(x.float(), down, None, ctx)
    snap = paths.snapshot()
    assert snap["counts"] == {"qmatmul.Q6_K.dense_plane": 1, "qmatmul.Q6_K.decode.repacked": 1}
    assert {k for k in snap["switched_off"] if ".w4" in k} == {"qmatmul.Q6_K.w4 (switched off by MINFER_QGEMM_W4=0)"}
    assert set(snap["fallbacks"]) == {"qmatmul.Q6_K.w4 (fell back because torch.float32 rows (the kernel "
                                      "multiplies bf16))"}


def test_switched_off_at_load_attaches_nothing(model):
    from minfer.ops import paths
    from minfer.runtime.dense_planes import attach_w4_planes, detach_dense_planes
    from minfer.switches import Switches

    m, _, _, _ = model
    detach_dense_planes(m)
    assert all(getattr(w, "batch_w4", None) is None and getattr(w, "batch_w4_group", None) is None for w in m.ws)
    paths.reset()
    assert attach_w4_planes(m, Switches(qgemm_w4=False)) == 0
    assert all(getattr(w, "batch_w4", None) is None for w in m.ws)
    assert "qmatmul.w4 (switched off by MINFER_QGEMM_W4=0)" in paths.snapshot()["switched_off"]


def test_other_gpus_fall_back_with_the_reason(monkeypatch):
    """sm_80 (A100) and sm_100 (B200) lack the kernel's PTX or wgmma: no planes, a fallback that
    names the GPU, so those GPUs keep cuBLAS over the dense planes."""
    from minfer.runtime import dense_planes

    for cap, ok in (((9, 0), True), ((8, 0), False), ((10, 0), False), ((12, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=cap: c)
        why = dense_planes.w4_unsupported(torch.device("cuda", 0))
        assert (why is None) == ok, (cap, why)
        if not ok:
            assert f"sm_{cap[0]}{cap[1]}" in why
    assert dense_planes.w4_unsupported(torch.device("cpu")) is None
