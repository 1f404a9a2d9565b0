"""nemotron_h_moe (NVIDIA Nemotron-3 Nano 30B-A3B / Nemotron-3 Super): each rule shown to be needed on the
fixtures (tests/data/arch, tools/arch_fixture_configs_b.py: tiny random NemotronHForCausalLM models converted by
llama.cpp's converter; the logits, greedy, cache-in-pieces and batch-engine checks against transformers are in
test_arch_vs_transformers.py), the layer kinds and cache geometry, the CPU's default (int8/int4) path, and bad
inputs named.

nemotron_h_moe: blocks M E M * E M, 8 ungated squared-ReLU experts of 32, top 2, sigmoid with a random selection
bias, renormalized, scale 2.5, a shared expert of 48. nemotron_h_moe-latent: M E * M E, top 3, the experts in a
32-wide latent (Nemotron-3 Super's form)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rewrite
from models.test_more_archs import logits_err

NAMES = ["nemotron_h_moe", "nemotron_h_moe-latent"]


def test_layer_kinds_and_cache_geometry():
    """The MoE blocks are the ones with feed_forward_length > 0 (the converter's "E"); they keep no cache
    rows and no state; the attention block keeps K/V rows, the Mamba-2 blocks their state."""
    from minfer.models.nemotron_h import ATTENTION, MAMBA, MLP

    m = engine("nemotron_h_moe").model
    assert m.kinds == (MAMBA, MLP, MAMBA, ATTENTION, MLP, MAMBA)
    assert [e is not None for e in m.moe] == [False, True, False, False, True, False]
    assert all(b.ffn_up is None for b in m.blocks)                     # no dense MLP loaded
    c = m.cfg
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_shared_ffn) == (8, 2, 32, 48)
    assert (c.expert_weights_scale, m.weights_norm, c.expert_groups) == (2.5, True, 1)
    assert m.moe[1].latent_down is None and m.moe[1].up_exps.shape == (8 * 32, 64)
    assert [s is not None for s in c.state_layers] == [True, False, True, False, False, True]
    lat = engine("nemotron_h_moe-latent").model
    e = lat.moe[1]
    assert e.latent_down.shape == (32, 64) and e.latent_up.shape == (64, 32)
    assert e.up_exps.shape == (8 * 48, 32) and e.down_exps.shape == (8 * 32, 48)
    assert e.up_shexp.shape == (32, 64) and lat.cfg.n_experts_used == 3


def _patch_moe(monkeypatch, **changes):
    """ops.moe_ffn with some options changed (the model's call passes them all as keywords)."""
    from minfer import ops

    orig = ops.moe_ffn

    def patched(*a, **kw):
        return orig(*a, **{**kw, **changes})
    monkeypatch.setattr(ops, "moe_ffn", patched)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("what", ["softmax", "no_select_bias", "not_renormalized", "unscaled", "relu_not_squared",
                                  "no_shared_expert", "shared_not_squared"])
def test_each_rule_is_needed(monkeypatch, name, what):
    """Sigmoid scores, the selection bias, the renormalized weights, the routed scale, the experts' square, the
    shared expert and its square: with any one changed the logits miss transformers' by far."""
    from minfer.models import nemotron_h_moe
    from minfer.ops import reference

    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL
    if what == "softmax":
        _patch_moe(monkeypatch, gating="softmax")
    elif what == "no_select_bias":
        _patch_moe(monkeypatch, select_bias=None)
    elif what == "not_renormalized":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "unscaled":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, expert_weights_scale=1.0))
    elif what == "relu_not_squared":
        monkeypatch.setattr(reference, "moe_act", lambda g, u, gb, ub, e, act, alpha, limit: torch.relu(u.float()))
    elif what == "no_shared_expert":
        monkeypatch.setattr(nemotron_h_moe, "relu2_ffn", lambda h, up, down, ctx: torch.zeros_like(h))
    else:
        monkeypatch.setattr(nemotron_h_moe, "relu2", torch.relu)
    assert logits_err(eng, name) > 10 * TOL


def test_default_cpu_path_packs_experts_and_stays_close(tmp_path, monkeypatch):
    """MINFER_CPU_QUANT on (the CPU's default): the stacked experts packed expert by expert (no dense copy),
    the mean next-token KL against transformers within the calibration's bound (runtime/cpu_calibration.py)."""
    from minfer.ops.cpu_experts import PackedExperts
    from minfer.runtime.cpu_calibration import CPU_INT4_KL_MAX
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    for name in NAMES:
        r = ref(name)
        eng = Engine.load(DATA / f"{name}.gguf", ctx=64, progress=False, switches=Switches(cpu_quant=True))
        experts = [w for w in eng.model.qweights() if getattr(w, "n_experts", None)]
        assert len(experts) == 4 and all(w.dense is None and isinstance(w.packed, PackedExperts) for w in experts)
        got = eng.logits(r["ids"].tolist()).numpy()
        a = torch.log_softmax(torch.from_numpy(r["logits"]).double(), -1)
        b = torch.log_softmax(torch.from_numpy(got).double(), -1)
        kl = float((a.exp() * (a - b)).sum(-1).mean())
        assert np.isfinite(got).all() and kl < CPU_INT4_KL_MAX, (name, kl)


A = "nemotron_h_moe"


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.exp_probs_b.bias",)), "blk.1.exp_probs_b.bias"),
    (dict(drop_tensors=("blk.4.ffn_up_shexp.weight",)), "blk.4.ffn_up_shexp.weight"),
    (dict(drop_tensors=("blk.1.ffn_down_exps.weight",)), "blk.1.ffn_down_exps.weight"),
    (dict(drop_tensors=("blk.4.ffn_gate_inp.weight",)), "blk.4.ffn_gate_inp.weight"),
    (dict(drop_keys=(f"{A}.expert_shared_feed_forward_length",)), f"{A}.expert_shared_feed_forward_length"),
    (dict(drop_keys=(f"{A}.expert_used_count",)), f"{A}.expert_used_count"),
    (dict(set_keys={f"{A}.expert_used_count": (9, gguf.GGUFValueType.UINT32)}), "expert_used_count=9"),
    (dict(set_keys={f"{A}.expert_gating_func": (1, gguf.GGUFValueType.UINT32)}), f"{A}.expert_gating_func"),
    (dict(set_keys={f"{A}.expert_group_count": (2, gguf.GGUFValueType.UINT32)},
          drop_keys=(f"{A}.expert_group_used_count",)), f"{A}.expert_group_used_count"),
    (dict(set_keys={f"{A}.moe_latent_size": (32, gguf.GGUFValueType.UINT32)}), "blk.1.ffn_latent_down.weight"),
    (dict(set_keys={f"{A}.moe_latent_size": (-1, gguf.GGUFValueType.INT32)}), f"{A}.moe_latent_size"),
    (dict(set_keys={f"{A}.expert_used_count": ([2] * 6, gguf.GGUFValueType.ARRAY)}), f"{A}.expert_used_count"),
    (dict(add_tensors={"blk.4.ffn_up_shexp.bias": np.zeros(48)}), "blk.4.ffn_up_shexp.bias"),
    (dict(add_tensors={"blk.1.ffn_down_exps.bias": np.zeros((8, 64))}), "blk.1.ffn_down_exps.bias"),
])
def test_bad_input_is_named(tmp_path, kw, match):
    assert_refused(A, tmp_path, kw, match)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.4.ffn_latent_up.weight",)), "blk.4.ffn_latent_up.weight"),
    (dict(drop_keys=(f"{A}.moe_latent_size",)), "blk.1.ffn_latent_down.weight"),
])
def test_latent_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "nemotron_h_moe-latent.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


def test_grouped_file_routes_within_the_best_groups(tmp_path):
    """expert_group_count 2 with expert_group_used_count 1 (HF n_group / topk_group): loads and routes within
    one group, which moves the logits (the fixture's transformers model has one group)."""
    p = rewrite(DATA / f"{A}.gguf", tmp_path / "g.gguf",
                set_keys={f"{A}.expert_group_count": (2, gguf.GGUFValueType.UINT32),
                          f"{A}.expert_group_used_count": (1, gguf.GGUFValueType.UINT32)})
    m = load(p)
    assert (m.cfg.expert_groups, m.cfg.expert_groups_used) == (2, 1)
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    r = ref(A)
    toks = torch.tensor(r["ids"][:12])
    got = m.forward(toks, Step.at(0, 12, "cpu"), KVCache.for_config(m.cfg, 64)).numpy()
    base = engine(A).model
    want = base.forward(toks, Step.at(0, 12, "cpu"), KVCache.for_config(base.cfg, 64)).numpy()
    assert np.abs(got - want).max() > 10 * TOL * np.abs(want).max()
