"""ops/cuda/pdl.enabled: which launch sites signal the next kernel before their wait (mode 2):
all the early_ok sites with Switches.pdl_early, only the named ones with pdl_early_sites, and
never a site that is not early_ok. The device check is stubbed (no GPU here): a CUDA device of
compute capability 9.0."""

from __future__ import annotations

import pytest

from minfer.ops.cuda import pdl
from minfer.switches import Switches


@pytest.fixture
def sm90(monkeypatch):
    import minfer.ops.cuda.dequant as dq

    monkeypatch.setattr(dq, "interpret", lambda: False)
    monkeypatch.setitem(pdl._capability, 0, (9, 0))
    return "cuda:0"


@pytest.mark.parametrize("sw,site,early_ok,mode", [
    (Switches(), "rope_kv", True, 1),
    (Switches(pdl_early=True), "rope_kv", True, 2),
    (Switches(pdl_early=True), "gemv", False, 1),
    (Switches(pdl_early_sites="rope_kv"), "rope_kv", True, 2),
    (Switches(pdl_early_sites="rope_kv"), "add_rms_norm", True, 1),
    (Switches(pdl_early_sites="swiglu,rope_kv"), "swiglu", True, 2),
    (Switches(pdl_early_sites="rope_kv"), "rope_kv", False, 1),
    (Switches(pdl=False, pdl_early_sites="rope_kv"), "rope_kv", True, 0),
])
def test_early_sites(sm90, sw, site, early_ok, mode):
    assert pdl.enabled(sw, sm90, site, early_ok=early_ok) == mode


@pytest.mark.parametrize("sw,role,mode", [
    (Switches(pdl_early_sites="attn_norm"), "attn_norm", 2),     # the norm before q/k/v
    (Switches(pdl_early_sites="attn_norm"), "", 1),              # the ffn norm: same site, no role
    (Switches(pdl_early_sites="add_rms_norm"), "", 2),
    (Switches(pdl_early_sites="swiglu"), "attn_norm", 1),
    (Switches(pdl=False, pdl_early_sites="attn_norm"), "attn_norm", 0),
])
def test_early_roles(sm90, sw, role, mode):
    assert pdl.enabled(sw, sm90, "add_rms_norm", early_ok=True, role=role) == mode


def test_attn_norm_role_reaches_the_norm(sm90, monkeypatch):
    """linear_add_rms_norm (the down projection, residual add and next layer's attention norm)
    asks for the attn_norm role; the model's other add_rms_norm call (the ffn norm) does not."""
    import torch
    from minfer.ops.cuda import norm_rope_act, qmatmul

    seen = []
    monkeypatch.setattr(qmatmul, "_linear", lambda a, w, b, sw, ws: a)
    monkeypatch.setattr(qmatmul, "_check", lambda a, w: None)
    monkeypatch.setattr(norm_rope_act, "add_rms_norm", lambda *a, role="", **k: seen.append(role))
    from minfer.ops.context import Context

    x = torch.zeros(1, 64)
    # (no weight here: the residual norm tails, which look at it, off)
    ctx = Context(Switches(gemv_raw_resnorm=False, gemv_q8_resnorm=False), None)
    qmatmul.linear_add_rms_norm(x, None, x, torch.ones(64), 1e-6, torch.float32, ctx, into_linear=True)
    assert seen == ["attn_norm"]


@pytest.mark.parametrize("sites,mode,want", [("combine", 1, 2), ("combine", 0, 0), ("", 1, 1),
                                             ("decode_attention", 1, 1), ("combine", 2, 2)])
def test_combine_role(sites, mode, want):
    assert pdl.early(Switches(pdl_early_sites=sites), mode, "combine") == want


@pytest.mark.parametrize("sites,want", [("combine", 2), ("", 1), ("attn_norm", 1)])
def test_combine_role_reaches_the_merge(monkeypatch, sites, want):
    """attention() hands the combine role's mode to decode_attention for the merge launch, and the
    attention kernel's own mode stays 1."""
    import importlib
    import torch
    from minfer.ops.context import Context

    att = importlib.import_module("minfer.ops.cuda.attention")
    got = {}
    monkeypatch.setattr(att, "pdl_enabled", lambda *a, **k: 1)
    monkeypatch.setattr(att, "decode_attention", lambda *a, **k: got.update(k))
    q = torch.zeros(1, 4, 8)
    kc = torch.zeros(16, 2, 8)
    att.attention(q, kc, kc, 3, Context(switches=Switches(pdl_early_sites=sites)))
    assert got["pdl"] == 1 and got["combine_pdl"] == want
