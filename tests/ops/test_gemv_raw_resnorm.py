"""The raw one-pass GEMV with the residual add and RMSNorm in its epilogue (Switches.gemv_raw_resnorm;
gemv.gemv_resnorm): the o projection of the small models (hidden <= 1024, raw Q5_0 / Q8_0 weights) makes
the FFN norm's s and h itself, its last program (an atomic ticket) norming the whole row. Here, in
Triton's interpreter on CPU tensors: s is resid + the GEMV's own output bit for bit, h is what the add +
norm kernel makes of them (the same operations), the ticket is zero again after the launch (graph
replays), linear_add_rms_norm takes the launch under the switch (counted) and gives the switch-off
numbers, and a K past the one-pass tile or a repacked weight keeps the two launches."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import DENSE_MODS, interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(DENSE_MODS + ["minfer.ops.cuda.linear_norm", "minfer.ops.cuda.q8_rows"]):
        yield mods


def _case(qt, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    raw = random_weight(int(qt), n, k, np.random.default_rng(seed))
    a = torch.randn(1, k, generator=g).to(torch.bfloat16)
    resid = torch.randn(1, n, generator=g) * 4
    wn = torch.rand(n, generator=g) + 0.5
    return torch.from_numpy(raw), a, resid, wn, reference_dequant(raw, int(qt), n, k)


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0], ids=["Q5_0", "Q8_0"])
@pytest.mark.parametrize("n,k", [(896, 896), (576, 576), (333, 1024)])
@pytest.mark.parametrize("hw", [False, True], ids=["bytes", "halfwords"])
def test_resnorm_is_the_gemv_then_the_add_norm_kernel(K, qt, n, k, hw):
    from minfer.ops import paths

    g, N = K["gemv"], K["norm_rope_act"]
    raw, a, resid, wn, ref_w = _case(qt, n, k, n + k + int(qt))
    cnt = torch.zeros(4, dtype=torch.int32)
    paths.reset()
    s, h = g.gemv_resnorm(a, raw, int(qt), n, k, resid, wn, 1e-6, torch.bfloat16, cnt, interpret=True, halfwords=hw)
    assert paths.snapshot()["counts"].get("gemv.raw_resnorm") == 1 and int(cnt.abs().sum()) == 0
    y = g.gemv(a, raw, int(qt), n, k, interpret=True, one_pass=True, halfwords=hw)        # the same GEMV alone
    assert torch.equal(s, resid + y.float())
    s2 = torch.empty(1, n)
    h2 = torch.empty(1, n, dtype=torch.bfloat16)
    N._add_rms_norm_launch(resid, y, wn, 1e-6, s2, h2)
    assert torch.equal(s, s2) and torch.equal(h, h2)
    y64 = a.double() @ torch.from_numpy(ref_w).double().T
    s64 = resid.double() + y64
    h64 = s64 * torch.rsqrt((s64 * s64).mean() + 1e-6) * wn.double()
    assert rel_err(s, s64) < 1e-2 and rel_err(h, h64) < 1e-2          # (y rounded to bf16 as ops.linear gives it)


def test_the_switch_routes_linear_add_rms_norm(K):
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches
    from minfer.weights import QWeight

    L = K["linear_norm"]
    raw, a, resid, wn, _ = _case(T.Q5_0, 896, 896, 3)
    w = QWeight("blk.0.attn_output.weight", int(T.Q5_0), (896, 896), raw)
    out = {}
    for on in (False, True):
        paths.reset()
        out[on] = L.linear_add_rms_norm(a, w, resid, wn, 1e-6, torch.bfloat16,
                                        Context(Switches(gemv_raw_resnorm=on), None), into_linear=True, role="ffn_norm")
        c = paths.snapshot()["counts"]
        assert (c.get("gemv.raw_resnorm", 0) == 1) == on and c.get("qmatmul.Q5_0.decode.one_pass") == 1, c
        assert on == (not any(k.startswith("add_rms_norm") for k in c)), c
    assert torch.equal(out[True][0], out[False][0])
    assert rel_err(out[True][1], out[False][1].double()) < 1e-2          # (the q8 norm kernel's own sum order)


def test_a_long_row_or_a_repacked_weight_keeps_two_launches(K):
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches
    from minfer.weights import QWeight

    g, L = K["gemv"], K["linear_norm"]
    raw, a, resid, wn, _ = _case(T.Q5_0, 256, 2048, 5)
    assert g.gemv_resnorm(a, raw, int(T.Q5_0), 256, 2048, resid, wn, 1e-6, torch.bfloat16,
                          torch.zeros(1, dtype=torch.int32), interpret=True) is None
    w = QWeight("blk.0.attn_output.weight", int(T.Q5_0), (256, 2048), raw)
    paths.reset()
    s, h = L.linear_add_rms_norm(a, w, resid, wn, 1e-6, torch.bfloat16, Context(Switches(gemv_raw_resnorm=True), None),
                                 into_linear=True, role="ffn_norm")
    c = paths.snapshot()["counts"]
    assert "gemv.raw_resnorm" not in c and any(k.startswith("add_rms_norm") for k in c), c
    with pytest.raises(ValueError, match="residual norm epilogue"):
        g.gemv(a, raw, int(T.Q5_0), 256, 2048, interpret=True, one_pass=True,
               resnorm=(resid, wn, 1e-6, torch.empty(1, 256), torch.empty(1, 256), torch.zeros(1, dtype=torch.int32)))
