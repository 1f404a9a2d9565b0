"""The Gluon decode GEMV's measuring/tuning options on the GPU: the table's sixth field (a
register cap, Triton's maxnreg), its seventh (late: with PDL the next kernel is signalled at the
programs' end) and the per-program timeline stamps (ops/cuda/timeline.py). None may change a bit
of the output; the stamps must describe every program (start <= end,
an SM of this GPU, all programs written)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import random_weight  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(qt, n, k, seed):
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G

    rw = G.repack(torch.from_numpy(random_weight(qt, n, k, np.random.default_rng(seed))).cuda(), qt, n, k)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    return rw, Q.quantize(x)


@pytest.mark.parametrize("qt,n,k,cfg,regs", [(12, 3584, 3584, (8, 16, 3, 4, False), 128),
                                             (12, 4608, 3584, (32, 2, 4, 4, True), 96),
                                             (14, 3584, 18944, (32, 2, 5, 4, True), 80)])
def test_register_cap_same_bits(qt, n, k, cfg, regs):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, q8 = _case(qt, n, k, n + qt)
    ws = GemvWorkspace("cuda")
    paths.reset()
    a = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    b = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg + (regs,), ws=ws, gluon=True)
    c = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg + (0, 1), ws=ws, gluon=True, pdl=1)
    assert torch.equal(a, b) and torch.equal(a, c)
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon") == 3 and not snap["fallbacks"], snap


def test_timeline_stamps_every_program_and_keeps_the_bits():
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import timeline
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, q8 = _case(12, 4608, 3584, 7)
    ws = GemvWorkspace("cuda")
    cfg = (32, 2, 4, 4, True)
    ref = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    timeline.RECORDER = rec = timeline.Recorder()
    try:
        out = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    finally:
        timeline.RECORDER = None
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert len(rec.launches) == 1
    key, grid, buf = rec.launches[0]
    assert key == "4608x3584" and grid == (144, 4)
    st = buf.view(-1, 4)[:, :3].cpu()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert st.shape[0] == 144 * 4
    assert bool((st[:, 1] >= st[:, 0]).all()) and bool((st[:, 0] > 0).all())
    assert bool(((st[:, 2] >= 0) & (st[:, 2] < sms)).all())
    # one launch: every program within a millisecond of the first
    assert int(st[:, 1].max() - st[:, 0].min()) < 1_000_000
