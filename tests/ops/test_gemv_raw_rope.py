"""The raw q/k/v GEMV with rope and the KV append in its epilogue (Switches.gemv_raw_rope; gemv_raw_rope.py), in
Triton's interpreter on CPU tensors: at Qwen2.5-0.5B's q/k/v (896 + 128 + 128 rows over 896, heads of 64) and a
head of 128, Q5_0 / Q8_0, neox and normal pairs, bf16 and float32, with the bias: q is the bits of the GEMV then
norm_rope_act's rope_kv kernel, the caches' row at the position holds that kernel's k and v bits and no other
cache row is written; the rotation agrees with the float64 reference rope of the gguf package's weight product;
and ops.linear_qkv_rope takes the stacked raw group under the switch (counted) with the switch-off path's bits,
and leaves a group that is not stacked whole (or the switch off) to the caller."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import DENSE_MODS, interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.config import RopeConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(DENSE_MODS + ["minfer.ops.cuda.gemv_q8_gluon_rope"]):
        yield mods


def _group(qt, nq, nk, k, seed):
    from minfer.weights import QWeight

    ws, refs = [], []
    for i, (nm, n) in enumerate((("q", nq), ("k", nk), ("v", nk))):
        raw = random_weight(int(qt), n, k, np.random.default_rng(seed + i))
        ws.append(QWeight(f"blk.0.attn_{nm}.weight", int(qt), (n, k), torch.from_numpy(raw)))
        refs.append(torch.from_numpy(reference_dequant(raw, int(qt), n, k)).double())
    g = torch.Generator().manual_seed(seed)
    biases = [torch.randn(w.shape[0], generator=g) for w in ws]
    return ws, refs, biases


def _caches(hkv, hd, dtype):
    return (torch.full((8, hkv, hd), 7.0, dtype=dtype), torch.full((8, hkv, hd), -7.0, dtype=dtype))


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0], ids=["Q5_0", "Q8_0"])
@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize("dtype,hd", [(torch.bfloat16, 64), (torch.float32, 64), (torch.bfloat16, 128)],
                         ids=["bf16", "f32", "bf16-hd128"])
def test_epilogue_is_the_gemv_then_rope_kv(K, qt, style, dtype, hd):
    g, N = K["gemv"], K["norm_rope_act"]
    nq, nk, k = 14 * hd, 2 * hd, 896
    ws, refs, biases = _group(qt, nq, nk, k, seed=hd + int(qt))
    cat = torch.cat([w.raw for w in ws])
    bias = torch.cat(biases)
    cfg = RopeConfig(theta=1e6, style=style, n_rot=hd)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    pos = torch.tensor([5])
    kc, vc = _caches(2, hd, dtype)
    rope = (pos, N._turns(cfg, "cpu"), kc, vc, nq, nk, hd, style == "neox")
    q = g.gemv(x, cat, int(qt), nq + 2 * nk, k, bias=bias, interpret=True, one_pass=True, rope=rope)[:, :nq]
    y = g.gemv(x, cat, int(qt), nq + 2 * nk, k, bias=bias, interpret=True, one_pass=True)      # the GEMV alone
    kc2, vc2 = _caches(2, hd, dtype)
    q2 = N.rope_kv_write(y[:, :nq].view(1, nq // hd, hd), y[:, nq:nq + nk].view(1, 2, hd),
                         y[:, nq + nk:].view(1, 2, hd), pos, cfg, kc2, vc2).reshape(1, nq)
    assert torch.equal(q, q2) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert torch.equal(kc[[0, 1, 2, 3, 4, 6, 7]], torch.full((7, 2, hd), 7.0, dtype=dtype))    # only row 5 written
    # the float64 reference: the weight product, then the rotation of each head's pairs at position 5
    yd = x.double() @ torch.cat(refs).T + bias.double()
    from minfer.ops import reference

    qd = reference.rope(yd[:, :nq].view(1, nq // hd, hd), pos, cfg).reshape(1, nq)
    kd = reference.rope(yd[:, nq:nq + nk].view(1, 2, hd), pos, cfg)
    assert rel_err(q, qd) < 2e-2 and rel_err(kc[5], kd[0]) < 2e-2 and rel_err(vc[5], yd[:, nq + nk:].view(2, hd)) < 2e-2


def test_refusals(K):
    g, N = K["gemv"], K["norm_rope_act"]
    ws, _, _ = _group(T.Q5_0, 896, 128, 896, seed=1)
    cat = torch.cat([w.raw for w in ws])
    kc, vc = _caches(2, 64, torch.float32)
    rope = (torch.tensor([1]), N._turns(RopeConfig(1e4, "neox", 64), "cpu"), kc, vc, 896, 128, 64, True)
    with pytest.raises(ValueError, match="rope epilogue"):          # two rows
        g.gemv(torch.randn(2, 896), cat, int(T.Q5_0), 1152, 896, interpret=True, one_pass=True, rope=rope)
    with pytest.raises(ValueError, match="rope epilogue"):          # a head dim the 4-row tiles do not pair
        g.gemv(torch.randn(1, 896), cat, int(T.Q5_0), 1152, 896, interpret=True, one_pass=True,
               rope=rope[:6] + (6,) + rope[7:])


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "v-apart"])
def test_linear_qkv_rope_routes_the_raw_group(K, stacked):
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda.gemv import fuse_raw_group
    from minfer.switches import Switches

    QM, N = K["qmatmul"], K["norm_rope_act"]
    ws, _, biases = _group(T.Q5_0, 896, 128, 896, seed=9)
    if not stacked:                                   # a Q8_0 v (the 0.5B's layers with more bits): q/k stacked
        from minfer.weights import QWeight

        raw = random_weight(int(T.Q8_0), 128, 896, np.random.default_rng(4))
        ws[2] = QWeight("blk.0.attn_v.weight", int(T.Q8_0), (128, 896), torch.from_numpy(raw))
    assert fuse_raw_group(tuple(ws))
    cfg = RopeConfig(theta=1e6, style="neox", n_rot=64)
    x = torch.randn(1, 896, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    pos = torch.tensor([3])
    got = {}
    for on in (False, True):
        kc, vc = _caches(2, 64, torch.bfloat16)
        paths.reset()
        q = QM.linear_qkv_rope(x, ws, biases, pos, cfg, kc, vc, Context(Switches(gemv_raw_rope=on), None))
        c = paths.snapshot()["counts"]
        assert (q is not None) == (on and stacked) and (c.get("gemv.raw_rope", 0) == 1) == (on and stacked), c
        if q is None:                                 # the caller's usual way
            q3 = QM.linear_many(x, ws, biases, Context(Switches(), None))
            q = N.rope_kv_write(q3[0].view(1, 14, 64), q3[1].view(1, 2, 64), q3[2].view(1, 2, 64), pos, cfg,
                                kc, vc).reshape(1, 896)
        got[on] = (q, kc, vc)
    assert all(torch.equal(a, b) for a, b in zip(got[True], got[False]))
