"""The hybrid Mamba-2 architectures on models/mamba2.py besides granitehybrid (test_granitehybrid.py):
each of their own rules is needed to meet transformers' logits, the layer kinds and the cache they
give, the engine's prefix rule, and malformed files refused by name.

nemotron_h's fixture (tools/gen_arch_fixtures.py): 6 blocks M - M * - M (Mamba-2, squared-ReLU MLP,
rope-less attention), Mamba-2 with 12 heads of 16 (inner 192, three times the width of 64), 2 groups,
state 16, conv of 4 taps. Logits, greedy and the cache in pieces: test_arch_vs_transformers.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


# ---- nemotron_h -----------------------------------------------------------------------------

def test_nemotron_h_layer_kinds_and_cache_geometry():
    m = engine("nemotron_h").model
    assert m.kinds == ("mamba2", "mlp", "mamba2", "attention", "mlp", "mamba2")
    d = m.dims
    assert (d.d_inner, d.d_state, d.n_heads, d.n_groups, d.d_conv, d.head_dim) == (192, 16, 12, 2, 4, 16)
    assert m.cfg.kv_layers == (None, None, None, (2, 16, 16), None, None)
    assert m.cfg.state_layers[1] is None and m.cfg.state_layers[3] is None
    assert m.cfg.state_layers[0] == ((4, 256), (2, 12, 16, 16))     # conv ring (K, di + 2GN), SSM ring (2, H, P, N)
    assert m.cfg.rms_eps == pytest.approx(1e-5)                     # attention.layer_norm_epsilon
    assert m.paged_kv and m.recurrent


def test_nemotron_h_preflight_counts_rows_and_state():
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    cfg = preflight.cache_config(GGUFFile(DATA / "nemotron_h.gguf"))
    assert preflight.kv_bytes_per_token(cfg, "cpu") == 2 * 2 * 16 * 4          # the one attention block
    assert preflight.state_bytes(cfg) == 3 * (4 * 256 + 2 * 12 * 16 * 16) * 4   # three Mamba-2 blocks
    assert engine("nemotron_h", ctx=100).cache.nbytes() == 100 * 256 + 3 * (4 * 256 + 2 * 12 * 16 * 16) * 4


def _nemotron_perturb(monkeypatch, m, what: str) -> None:
    import torch.nn.functional as F

    from minfer import ops
    from minfer.models import mamba2, nemotron_h

    if what == "relu_not_squared":         # relu(W_up h) without the square
        monkeypatch.setattr(nemotron_h, "relu2", F.relu)
    elif what == "silu_mlp":               # the MLP's activation read as SiLU
        monkeypatch.setattr(nemotron_h, "relu2", F.silu)
    elif what == "rope_on_attention":      # rope applied to q and k (NEOX, theta 10000)
        from minfer.config import RopeConfig
        rope = RopeConfig(theta=10000.0, style="neox", n_rot=m.cfg.head_dim)
        real = m.mixer

        def with_rope(h, i, cache, step, ctx):
            if m.kinds[i] != "attention":
                return real(h, i, cache, step, ctx)
            blk, c = m.blocks[i], m.cfg
            T = h.shape[0]
            q, k, v = (ops.linear(h, w, None, ctx) for w in (blk.attn_q, blk.attn_k, blk.attn_v))
            q = ops.rope(q.view(T, c.n_heads, c.head_dim), step.positions, rope)
            k = ops.rope(k.view(T, c.n_kv_heads, c.head_dim), step.positions, rope)
            cache.write(i, k, v.view(T, c.n_kv_heads, c.head_dim), step)
            return ops.linear(cache.attend(i, q, step, ctx).reshape(T, -1), blk.attn_output, None, ctx)
        monkeypatch.setattr(m, "mixer", with_rope)
    elif what == "attention_scale":        # scores not divided by sqrt(head_dim)
        from minfer.runtime.kv_cache import KVCache
        real_attend = KVCache.attend
        monkeypatch.setattr(KVCache, "attend", lambda self, layer, q, step, ctx=None, **kw:
                            real_attend(self, layer, q, step, ctx, scale=1.0))
    elif what == "whole_norm":             # the Mamba-2 norm over all channels, not per group
        real = mamba2.gated_group_norm
        monkeypatch.setattr(mamba2, "gated_group_norm", lambda y, z, wt, g, eps: real(y, z, wt, 1, eps))
    elif what == "gate_after_norm":        # norm first, then the gate
        real = mamba2.gated_group_norm
        monkeypatch.setattr(mamba2, "gated_group_norm",
                            lambda y, z, wt, g, eps: real(y, torch.full_like(z, 30.0), wt, g, eps) * F.silu(z))
    elif what == "mlp_block_as_attention_norm_only":   # an MLP block skipped (its kind misread)
        real = m.mixer
        monkeypatch.setattr(m, "mixer", lambda h, i, *a: torch.zeros_like(h) if m.kinds[i] == "mlp"
                            else real(h, i, *a))
    else:
        raise AssertionError(what)


NEMOTRON_RULES = ["relu_not_squared", "silu_mlp", "rope_on_attention", "attention_scale", "whole_norm",
                  "gate_after_norm", "mlp_block_as_attention_norm_only"]


@pytest.mark.parametrize("what", NEMOTRON_RULES)
def test_nemotron_h_each_rule_is_needed(monkeypatch, what):
    eng = engine("nemotron_h")
    assert miss(eng, "nemotron_h") < TOL
    _nemotron_perturb(monkeypatch, eng.model, what)
    eng.reset()
    err = miss(eng, "nemotron_h")
    assert not err < 10 * TOL, (what, err)


def test_nemotron_h_inner_size_need_not_be_twice_the_width():
    """The fixture's inner size is 3 * D (Nemotron Nano 9B v2: 10240 at 4480): granitehybrid's rule
    (inner_twice) refuses it, nemotron_h reads it."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import mamba2

    gf = GGUFFile(DATA / "nemotron_h.gguf")
    with pytest.raises(MinferError, match="inner_size=192 is not twice"):
        mamba2.read_dims(gf, "nemotron_h", 64)
    assert mamba2.read_dims(gf, "nemotron_h", 64, inner_twice=False).d_inner == 192


def test_nemotron_h_prefix_reused_only_whole(monkeypatch):
    """The engine's rule for a recurrent model (Model.recurrent): a prompt that diverges inside the
    cached tokens is recomputed from 0; without the rule it would continue from the wrong state."""
    ids = ref("nemotron_h")["ids"].tolist()
    other = ids[:25] + [7, 8, 9]
    fresh = engine("nemotron_h").logits(other)[-1]
    eng = engine("nemotron_h")
    eng.prefill(ids[:30])
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) < 1e-6
    eng = engine("nemotron_h")
    eng.prefill(ids[:30])
    monkeypatch.setattr(eng.model, "recurrent", False)
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) > 10 * TOL


def _batch_equals_single(name):
    """BatchEngine.from_engine (`minfer serve -np N`) runs two prompts at once, each equal to its
    single greedy (runtime/paged_state.py; tests/runtime/test_paged_recurrent.py has the rest)."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    eng, ids, g = engine(name), ref(name)["ids"].tolist(), SamplingParams(temperature=0)
    be = BatchEngine.from_engine(eng, max_seqs=2)
    prompts = [ids[:20], ids[3:14]]
    assert be.cache.states is not None and not be.blocks.prefix_cache
    for p, out in zip(prompts, be.generate_many(prompts, g, 6)):
        assert [ev.token_id for ev in out] == [ev.token_id for ev in eng.generate(p, g, max_new_tokens=6)]


def test_nemotron_h_batch_engine_serves_it():
    _batch_equals_single("nemotron_h")


@pytest.mark.parametrize("tensor", ["blk.0.ssm_in.weight", "blk.2.ssm_norm.weight", "blk.5.ssm_a",
                                    "blk.1.ffn_up.weight", "blk.4.ffn_down.weight", "blk.3.attn_v.weight",
                                    "blk.3.attn_norm.weight", "output_norm.weight"])
def test_nemotron_h_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "nemotron_h.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["nemotron_h.ssm.inner_size", "nemotron_h.ssm.group_count",
                                 "nemotron_h.attention.layer_norm_epsilon"])
def test_nemotron_h_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "nemotron_h.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_nemotron_h_bias_and_no_attention_refused(tmp_path):
    import gguf

    p = rewrite(DATA / "nemotron_h.gguf", tmp_path / "b.gguf", add_tensors={"blk.1.ffn_up.bias": np.zeros(96)})
    with pytest.raises(MinferError, match=r"blk\.1\.ffn_up\.bias.*bias tensors are not supported"):
        load(p)
    # the kv heads moved from the attention block 3 to the MLP block 4: llama.cpp reads an MLP block there
    # (n_ff > 0) and block 3 as a Mamba-2 one, no attention block left
    no_attn = rewrite(DATA / "nemotron_h.gguf", tmp_path / "n.gguf", set_keys={
        "nemotron_h.attention.head_count_kv": ([0, 0, 0, 0, 2, 0], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match="at least one attention block"):
        load(no_attn)


def test_zero_ffn_items_accepted_for_nemotron_h_only():
    """metadata_check: feed_forward_length's 0 items (the blocks without an MLP) pass for nemotron_h;
    the same array under another architecture's key is a problem."""
    from minfer import metadata_check

    check = metadata_check.ARCH_KEYS["feed_forward_length"]
    assert metadata_check._arch_check("nemotron_h", "feed_forward_length", check)([0, 96, 0]) is None
    assert metadata_check._arch_check("gemma4", "feed_forward_length", check)([0, 96, 0]) is not None
    assert metadata_check._arch_check("nemotron_h", "feed_forward_length", check)([0, 0]) is not None


# ---- falcon-h1 ------------------------------------------------------------------------------
# fixtures: 3 layers, attention (4 heads, 2 kv, head 16, NEOX rope) and Mamba-2 in each; falcon-h1: 6 heads
# of 16 (inner 96), 2 groups, the gated group norm; falcon-h1-nonorm: 8 heads of 16, 1 group, no norm (y * silu(z)).
# Every muP multiplier away from 1 (folded into the weights by the converter).

def test_falcon_h1_cache_geometry_and_preflight():
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    m = engine("falcon-h1").model
    d = m.dims
    assert (d.d_inner, d.d_state, d.n_heads, d.n_groups, d.d_conv, d.head_dim) == (96, 16, 6, 2, 4, 16)
    assert m.cfg.state_layers == (((4, 160), (2, 6, 16, 16)),) * 3          # conv ring (K, di + 2GN), SSM ring
    assert getattr(m.cfg, "kv_layers", None) is None                        # one geometry: every layer attends
    assert all(w.norm is not None for w in m.mamba)
    assert all(w.norm is None for w in engine("falcon-h1-nonorm").model.mamba)
    assert m.paged_kv and m.recurrent and m.rope_style == "neox"
    cfg = preflight.cache_config(GGUFFile(DATA / "falcon-h1.gguf"))
    per, fixed = preflight.kv_bytes_per_token(cfg, "cpu"), preflight.state_bytes(cfg)
    assert per == 3 * 2 * 2 * 16 * 4 and fixed == 3 * (4 * 160 + 2 * 6 * 16 * 16) * 4
    assert engine("falcon-h1", ctx=100).cache.nbytes() == 100 * per + fixed


def _falcon_perturb(monkeypatch, m, what: str) -> None:
    import dataclasses

    import torch.nn.functional as F

    from minfer import ops
    from minfer.models import mamba2

    if what == "adjacent_pairs":           # rope on adjacent pairs (NORM) instead of halves
        monkeypatch.setattr(m, "cfg", dataclasses.replace(m.cfg, rope=dataclasses.replace(m.cfg.rope, style="normal")))
    elif what == "no_rope":
        monkeypatch.setattr(m, "cfg", dataclasses.replace(m.cfg, rope=dataclasses.replace(m.cfg.rope, theta=1e30)))
    elif what == "no_ssm_branch":          # the state still updated, the branch not added
        real = type(m).ssm
        monkeypatch.setattr(m, "ssm", lambda h, i, cache, step, ctx: real(m, h, i, cache, step, ctx) * 0)
    elif what == "no_attention_branch":
        real = type(m).attention
        monkeypatch.setattr(m, "attention", lambda h, i, cache, step, ctx: real(m, h, i, cache, step, ctx) * 0)
    elif what == "ssm_after_attention":    # sequential (Jamba-like): Mamba-2 on the norm of x + attention
        from minfer.models.layers import ffn_branch

        def sequential(tokens, step, cache, ctx=None):
            eps, x = m.cfg.rms_eps, ops.embedding(tokens, m.token_embd)
            for i, blk in enumerate(m.blocks):
                x = x + m.attention(ops.rms_norm(x, blk.attn_norm, eps), i, cache, step, ctx)
                x = x + m.ssm(ops.rms_norm(x, blk.attn_norm, eps), i, cache, step, ctx)
                x = x + ffn_branch(ops.rms_norm(x, blk.ffn_norm, eps), blk, ctx)
            return ops.linear(ops.rms_norm(step.rows(x), m.output_norm, eps), m.output, None, ctx)
        monkeypatch.setattr(m, "forward", sequential)
    elif what == "ffn_norm_as_attn_norm":  # the MLP's input normed by attn_norm
        for b in m.blocks:
            b.ffn_norm = b.attn_norm
    elif what == "norm_skipped":           # the gated group norm left out where ssm_norm is present
        monkeypatch.setattr(mamba2, "gated_group_norm", lambda y, z, wt, g, eps: y * F.silu(z))
    elif what == "gate_after_norm":        # HF's norm_before_gate=True reading
        real = mamba2.gated_group_norm
        monkeypatch.setattr(mamba2, "gated_group_norm",
                            lambda y, z, wt, g, eps: real(y, torch.full_like(z, 30.0), wt, g, eps) * F.silu(z))
    elif what == "no_gate":                # y alone (nonorm fixture: what is left without the gate)
        monkeypatch.setattr(mamba2, "gated_group_norm", lambda y, z, wt, g, eps: y)
    else:
        raise AssertionError(what)


FALCON_RULES = [("falcon-h1", "adjacent_pairs"), ("falcon-h1", "no_rope"), ("falcon-h1", "no_ssm_branch"),
                ("falcon-h1", "no_attention_branch"), ("falcon-h1", "ssm_after_attention"),
                ("falcon-h1", "ffn_norm_as_attn_norm"), ("falcon-h1", "norm_skipped"), ("falcon-h1", "gate_after_norm"),
                ("falcon-h1-nonorm", "no_gate"), ("falcon-h1-nonorm", "no_ssm_branch")]


@pytest.mark.parametrize("name,what", FALCON_RULES)
def test_falcon_h1_each_rule_is_needed(monkeypatch, name, what):
    eng = engine(name)
    assert miss(eng, name) < TOL
    _falcon_perturb(monkeypatch, eng.model, what)
    eng.reset()
    err = miss(eng, name)
    assert not err < 10 * TOL, (what, err)


def test_falcon_h1_prefix_reused_only_whole(monkeypatch):
    ids = ref("falcon-h1")["ids"].tolist()
    other = ids[:25] + [7, 8, 9]
    fresh = engine("falcon-h1").logits(other)[-1]
    eng = engine("falcon-h1")
    eng.prefill(ids[:30])
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) < 1e-6
    eng = engine("falcon-h1")
    eng.prefill(ids[:30])
    monkeypatch.setattr(eng.model, "recurrent", False)
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) > 10 * TOL


def test_falcon_h1_batch_engine_serves_it():
    _batch_equals_single("falcon-h1")


@pytest.mark.parametrize("tensor", ["blk.1.ffn_norm", "blk.0.ssm_in.weight", "blk.2.ssm_conv1d.weight",
                                    "blk.1.ssm_dt.bias", "blk.0.attn_q.weight", "blk.2.ffn_gate.weight"])
def test_falcon_h1_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "falcon-h1.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["falcon-h1.ssm.inner_size", "falcon-h1.ssm.time_step_rank",
                                 "falcon-h1.attention.layer_norm_rms_epsilon"])
def test_falcon_h1_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "falcon-h1.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_falcon_h1_bias_refused(tmp_path):
    p = rewrite(DATA / "falcon-h1.gguf", tmp_path / "b.gguf", add_tensors={"blk.2.ffn_down.bias": np.zeros(64)})
    with pytest.raises(MinferError, match=r"blk\.2\.ffn_down\.bias.*bias tensors are not supported"):
        load(p)
