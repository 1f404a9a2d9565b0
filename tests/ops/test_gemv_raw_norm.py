"""The residual add + RMSNorm made by the raw-block group GEMV's own programs (Switches.gemv_raw_norm,
ops/cuda/gemv.py _norm_runs): the small models' norm before q/k/v and before gate/up without its own
launch. The CUDA backend's code runs in Triton's interpreter on CPU tensors; the references are
independent of the fold: the add + norm kernel it replaces (norm_rope_act._add_rms_norm_kernel) for s
and h, a float64 product with the gguf package's dequantized weights for the GEMV, and the CPU
reference model's forward for a whole decode step."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kernel_data import DENSE_MODS, interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(DENSE_MODS):
        yield mods


def _row(k, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g) * 3
    y = torch.randn(1, k, generator=g).to(dtype)
    w = torch.rand(k, generator=g) + 0.5
    return x, y, w


@pytest.mark.parametrize("qt,n,k,dtype", [(T.Q5_0, 72, 896, torch.bfloat16), (T.Q8_0, 37, 576, torch.bfloat16),
                                          (T.Q5_0, 40, 640, torch.float32)])
def test_norm_prologue_is_the_add_norm_kernel_then_the_gemv(K, qt, n, k, dtype):
    g, nra = K["gemv"], K["norm_rope_act"]
    raw = random_weight(int(qt), n, k, np.random.default_rng(n))
    wd = torch.from_numpy(reference_dequant(raw, int(qt), n, k)).double()
    raw_t = torch.from_numpy(raw)
    x, y, nw = _row(k, k + n, dtype)
    # the two launches it replaces: the add + norm kernel into (s0, h0), then the GEMV on h0
    s0, h0 = torch.empty(1, k), torch.empty(1, k, dtype=dtype)
    nra._add_rms_norm_launch(x, y, nw, 1e-6, s0, h0)
    # the fold: h and s written by program 0, the product of the h its programs made
    s, h = torch.full((1, k), float("nan")), torch.zeros(1, k, dtype=dtype)
    out = g.gemv(h, raw_t, int(qt), n, k, out_dtype=torch.float32, interpret=True, one_pass=True,
                 norm=(x, y, nw, 1e-6, s))
    assert torch.equal(s, x + y.float())                                   # the same float32 add
    # h: the same operations, the sum of squares in another order (rstd within an ulp or two of
    # float32): in bf16 a value on a rounding edge may round the other way, nothing else
    diff = (h.float() - h0.float()).abs()
    step = h0.float().abs() * (2.0 ** -7 if dtype == torch.bfloat16 else 1e-6) + 1e-30
    assert bool((diff <= step).all()) and int((diff > 0).sum()) <= max(2, k // 100), int((diff > 0).sum())
    assert rel_err(out, h.double() @ wd.T) < 1e-5                         # the GEMV of the h it stored
    assert rel_err(out, h0.double() @ wd.T) < 2e-3


def test_norm_prologue_needs_one_pass(K):
    g = K["gemv"]
    raw = torch.from_numpy(random_weight(int(T.Q8_0), 16, 2048, np.random.default_rng(1)))
    x, y, nw = _row(2048, 1, torch.bfloat16)
    h, s = torch.empty(1, 2048, dtype=torch.bfloat16), torch.empty(1, 2048)
    with pytest.raises(ValueError, match="one row in one pass"):
        g.gemv(h, raw, int(T.Q8_0), 16, 2048, interpret=True, one_pass=True, norm=(x, y, nw, 1e-6, s))


def _tiny(tmp_path, qtype, arch="qwen2", seed=5, name="m"):
    from models.tiny import TinySpec, write_tiny_model

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model

    path = write_tiny_model(tmp_path / f"{name}.gguf", TinySpec(arch=arch, qtype=qtype, seed=seed))
    return load_model(GGUFFile(path), progress=False)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_model_decode_with_the_norms_in_the_raw_groups(K, monkeypatch, tmp_path, arch):
    """A tiny model in Q8_0 with its decode groups fused as the engine fuses them on CUDA, the
    workspace marked as the engine marks it (gemv.raw_prenorm_roles): a decode step with the switch on
    equals the CPU reference forward and the step with it off; every norm before a group is made by
    the group's launch (2 L - 1 a step: the first layer's norm is the embedding's, the last one the
    output norm's) and no add + norm kernel runs for them; nothing falls back."""
    from kernel_data import route_to_cuda

    from minfer.models import Step
    from minfer.ops import paths
    from minfer.runtime.kv_cache import KVCache

    C = K["cuda"]
    m = _tiny(tmp_path, T.Q8_0, arch)
    toks = torch.tensor([3, 17, 42, 5, 9, 33, 1, 28])
    ref_cache = KVCache.for_config(m.cfg, 32)
    m.forward(toks, Step.at(0, 8, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(8, 1, "cpu"), ref_cache)

    assert K["gemv"].fuse_raw_groups(m) == 2 * m.cfg.n_layers
    route_to_cuda(monkeypatch, C)
    ws = C.Workspace.for_model(m)
    assert not ws.raw_prenorm
    ws.raw_prenorm = K["gemv"].raw_prenorm_roles(m)
    assert ws.raw_prenorm == {"attn_norm", "ffn_norm"}
    decs, snaps = {}, {}
    for on in (False, True):
        # (the residual norm tails, on by default, make these norms in the GEMV before and take them first: off)
        ctx = Context(Switches(gemv_raw_norm=on, gemv_raw_resnorm=False, gemv_q8_resnorm=False), ws)
        cache = KVCache.for_config(m.cfg, 32)
        m.forward(toks, Step.at(0, 8, "cpu"), cache, ctx)
        paths.reset()
        decs[on] = m.forward(torch.tensor([7]), Step(torch.tensor([8]), None, "all"), cache, ctx)
        snaps[on] = paths.snapshot()
    assert rel_err(decs[True], ref_dec.double()) < 1e-5 and rel_err(decs[True], decs[False].double()) < 1e-6
    on, off = snaps[True]["counts"], snaps[False]["counts"]
    L = m.cfg.n_layers
    assert on["gemv.raw_norm"] == on["add_rms_norm.into_raw_gemv"] == 2 * L - 1, on
    assert "gemv.raw_norm" not in off and "add_rms_norm.into_raw_gemv" not in off, off
    # the add + norm kernels left: the output norm's only (the switch off: every one of them)
    norms_on = sum(v for key, v in on.items() if key.startswith("add_rms_norm.") and "into" not in key)
    norms_off = sum(v for key, v in off.items() if key.startswith("add_rms_norm.") and "into" not in key)
    assert norms_on == 1 and norms_off == 2 * L, (on, off)
    assert on["qmatmul.group3.decode.raw.one_pass"] == on["qmatmul.group2.decode.raw.one_pass"] == L
    assert not snaps[True]["fallbacks"], snaps[True]["fallbacks"]


def test_a_consumer_that_cannot_fold_runs_the_norm_first(K, monkeypatch, tmp_path):
    """With the workspace marked but the raw groups' launches switched off (one GEMV a weight), the
    deferred norm is made by its kernel before the first weight's GEMV -- the same decode -- and
    counted as that fold's fallback naming why."""
    from kernel_data import route_to_cuda

    from minfer.models import Step
    from minfer.ops import paths
    from minfer.runtime.kv_cache import KVCache

    C = K["cuda"]
    m = _tiny(tmp_path, T.Q8_0)
    toks = torch.tensor([3, 17, 42, 5])
    ref_cache = KVCache.for_config(m.cfg, 32)
    m.forward(toks, Step.at(0, 4, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(4, 1, "cpu"), ref_cache)
    K["gemv"].fuse_raw_groups(m)
    route_to_cuda(monkeypatch, C)
    ws = C.Workspace.for_model(m)
    ws.raw_prenorm = frozenset({"attn_norm", "ffn_norm"})
    ctx = Context(Switches(gemv_raw_norm=True, gemv_raw_fuse=False, gemv_raw_resnorm=False, gemv_q8_resnorm=False), ws)
    cache = KVCache.for_config(m.cfg, 32)
    m.forward(toks, Step.at(0, 4, "cpu"), cache, ctx)
    paths.reset()
    dec = m.forward(torch.tensor([7]), Step(torch.tensor([4]), None, "all"), cache, ctx)
    assert rel_err(dec, ref_dec.double()) < 1e-5
    fb = paths.snapshot()["fallbacks"]
    assert [key for key in fb if key.startswith("add_rms_norm.into_raw_gemv") and "raw-block GEMV launch" in key], fb


def test_raw_prenorm_roles_need_every_layers_group_fused_in_one_pass(K, tmp_path):
    roles = K["gemv"].raw_prenorm_roles
    m = _tiny(tmp_path, T.Q8_0)
    assert roles(m) == frozenset()                          # nothing fused yet
    K["gemv"].fuse_raw_groups(m)
    assert roles(m) == {"attn_norm", "ffn_norm"}
    m4 = _tiny(tmp_path, T.Q4_0, seed=6, name="b")
    K["gemv"].fuse_raw_groups(m4)
    assert roles(m4) == {"attn_norm", "ffn_norm"}
    q = m4.decode_groups()[0][0]
    q.batch_dense = object()                                # the batch engine's dense plane takes its rows
    assert roles(m4) == {"ffn_norm"}
    del q.batch_dense
    gate = next(g for g in m4.decode_groups() if g[0].name.endswith("ffn_gate.weight"))[0]
    rg = gate.raw_group
    del gate.raw_group                                      # one layer's gate/up not one launch: no FFN fold
    assert roles(m4) == {"attn_norm"}
    gate.raw_group = rg
    monkey = K["gemv"].ONE_PASS_MAX_K
    try:
        K["gemv"].ONE_PASS_MAX_K = 16                       # a K past one pass: the groups do not fold
        assert roles(m4) == frozenset()
    finally:
        K["gemv"].ONE_PASS_MAX_K = monkey
