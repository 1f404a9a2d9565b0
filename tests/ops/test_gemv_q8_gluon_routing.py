"""Which GPUs and shapes take the Gluon q8 GEMV (minfer.ops.cuda.gemv_q8_gluon), checked without a
GPU: sm_90 only (its table was measured on the H200; another GPU keeps the Triton kernel and the
launch counts a fallback that names the GPU), shapes of its table or an explicit config, tiles it
can run."""

from __future__ import annotations

import torch

from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked


def test_only_sm90_takes_it(monkeypatch):
    for cap, ok in (((9, 0), True), ((8, 0), False), ((10, 0), False), ((8, 9), False)):
        GL._capability.clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None, c=cap: c)
        why = GL.device_unsupported(torch.device("cuda", 0))
        assert (why is None) == ok, (cap, why)
        if not ok:
            assert f"sm_{cap[0]}{cap[1]}" in why
    GL._capability.clear()


def test_table_shapes_and_tiles():
    # the 7B's large shapes are in the H200 table; a shape never swept is not (the Triton kernel)
    for qt, n, k in ((Q4_K, 37888, 3584), (Q6_K, 152064, 3584), (Q4_K, 3584, 18944), (Q6_K, 3584, 18944)):
        cfg = GL.config_for(qt, n, k)
        assert cfg is not None and 4 <= len(cfg) <= 11, (qt, n, k)
        rw = Repacked(qt, n, k, (torch.zeros(1),))
        assert GL.supported((rw,), cfg[0], cfg[1]) is None
    assert GL.config_for(Q4_K, 1000, 768) is None
    rw = Repacked(Q4_K, 64, 256, (torch.zeros(1),))
    assert GL.supported((rw,), 32, 3) is not None and GL.supported((rw,), 12, 2) is not None
    assert "type" in GL.supported((Repacked(8, 64, 256, (torch.zeros(1),)),), 32, 2)
