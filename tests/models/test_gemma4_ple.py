"""Google Gemma 4, the E2B/E4B form (minfer/models/gemma4.py): per-layer embeddings, shared-KV layers
and double-wide MLPs, against transformers on the CPU's float32 reference: logits at every position,
greedy, the cache in pieces and the paged cache; each per-layer-embedding and shared-KV rule needed
(with one changed the logits miss by more than 10x the tolerance); missing tensors and layer patterns
llama.cpp and HF would read differently refused by name. Fixture: tests/data/arch/gemma4-ple.gguf
(tools/gen_arch_fixtures.py: Gemma4ForCausalLM with hidden_size_per_layer_input 16, layers 3-5
sharing the caches of layers 1 (window) and 2 (global), feed_forward_length [96 x3, 192 x3])."""

from __future__ import annotations

import math

import gguf
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "gemma4-ple"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_shared_layers_read_the_producers_caches_and_write_none():
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    m = engine(NAME).model
    assert m.kv_source == [0, 1, 2, 1, 1, 2]
    assert [b.attn_k is None and b.attn_k_norm is None for b in m.blocks] == [False] * 3 + [True] * 3
    assert [b.ffn_up.shape[0] for b in m.blocks] == [96] * 3 + [192] * 3 and m.ple_dim == 16
    cache = KVCache.for_config(m.cfg, 64)
    m.forward(torch.arange(3, 23), Step.at(0, 20, "cpu"), cache)
    assert all(cache.k[i][:20].abs().sum(-1).min() > 0 for i in range(3))
    assert cache.k[3] is cache.k[4] is cache.k[5] is cache.v[3] is cache.v[4] is cache.v[5] is None   # no storage


def _ple(m, tokens, x0, ctx, what):
    """The model's per-layer inputs with one rule changed."""
    T, L, P, D, eps = tokens.shape[0], m.cfg.n_layers, m.ple_dim, m.cfg.d_model, m.cfg.rms_eps
    proj = ops.linear(x0, m.ple_model_proj, None, ctx).float() / (1.0 if what == "no_projection_scale" else math.sqrt(D))
    if what != "no_projection_norm":
        proj = ops.rms_norm(proj.reshape(T * L, P), m.ple_proj_norm, eps)
    proj = proj.view(T, L, P)
    tok = ops.embedding(tokens, m.ple_token_embd).view(T, L, P) * (1.0 if what == "no_token_scale" else math.sqrt(P))
    if what == "no_token_part":
        tok = torch.zeros_like(tok)
    if what == "no_context_part":
        proj = torch.zeros_like(proj)
    return (proj + tok) * (1.0 if what == "no_input_scale" else 1.0 / math.sqrt(2.0))


# (the 1/sqrt(D) before the projection norm and the 1/sqrt(2) of the sum are not among them: a norm
# follows each -- the projection's RMSNorm, and the branch's post_norm after a product and a linear map --
# so neither changes the logits beyond epsilon; minfer applies both, as llama.cpp and HF do)
PLE_RULES = ["no_token_part", "no_context_part", "no_token_scale", "no_projection_norm"]
BRANCH_RULES = ["no_per_layer_branch", "no_gelu_on_gate", "no_post_norm", "branch_before_ffn"]
SHARED_RULES = ["shared_window_reads_layer0", "shared_reads_last_layer", "shared_recompute_own_kv"]


@pytest.mark.parametrize("what", PLE_RULES + BRANCH_RULES + SHARED_RULES)
def test_each_rule_is_needed(monkeypatch, what):
    from minfer.models import gemma4

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what in PLE_RULES:
        monkeypatch.setattr(m, "_per_layer_inputs", lambda tokens, x0, ctx: _ple(m, tokens, x0, ctx, what))
    elif what == "no_per_layer_branch":
        monkeypatch.setattr(m, "_per_layer_branch", lambda x, i, ple, ctx: x)
    elif what == "no_gelu_on_gate":               # the gate's projection times the input, unactivated
        def branch(x, i, ple, ctx):
            g = ops.linear(x, m.ple_gate[i], None, ctx) * ple[:, i]
            return x + ops.rms_norm(ops.linear(g, m.ple_proj[i], None, ctx), m.ple_post_norm[i], m.cfg.rms_eps)
        monkeypatch.setattr(m, "_per_layer_branch", branch)
    elif what == "no_post_norm":
        def branch(x, i, ple, ctx):
            g = ops.geglu(ops.linear(x, m.ple_gate[i], None, ctx), ple[:, i].contiguous())
            return x + ops.linear(g, m.ple_proj[i], None, ctx)
        monkeypatch.setattr(m, "_per_layer_branch", branch)
    elif what == "branch_before_ffn":             # the per-layer branch after the attention residual instead
        real_branch = gemma4.Gemma4Model._per_layer_branch

        def forward(self, tokens, step, cache, ctx=None):
            eps = self.cfg.rms_eps
            x = ops.embedding(tokens, self.token_embd) * self.embed_scale
            ple = self._per_layer_inputs(tokens, x, ctx)
            for i, blk in enumerate(self.blocks):
                a = self._attention(ops.rms_norm(x, blk.attn_norm, eps), blk, i, cache, step, ctx)
                x = x + ops.rms_norm(a, self.post_attention_norm[i], eps)
                x = real_branch(self, x, i, ple, ctx)
                h = ops.rms_norm(x, blk.ffn_norm, eps)
                f = ops.linear(ops.geglu(ops.linear(h, blk.ffn_gate), ops.linear(h, blk.ffn_up)), blk.ffn_down)
                x = (x + ops.rms_norm(f, self.post_ffw_norm[i], eps)) * self.out_scale[i]
            logits = ops.linear(ops.rms_norm(step.rows(x), self.output_norm, eps), self.output)
            return self.final_softcap * torch.tanh(logits / self.final_softcap)
        monkeypatch.setattr(gemma4.Gemma4Model, "forward", forward)
    elif what == "shared_window_reads_layer0":    # the first window layer's cache, not the last one's
        monkeypatch.setattr(m, "kv_source", [0, 1, 2, 0, 0, 2])
    elif what == "shared_reads_last_layer":       # every shared layer on the last producer (layer 2)
        monkeypatch.setattr(m, "kv_source", [0, 1, 2, 2, 2, 2])
    else:                                         # the shared layers with k/v of their own (the producer's weights)
        for i, src in ((3, 1), (4, 1), (5, 2)):
            for name in ("attn_k", "attn_v", "attn_k_norm"):
                monkeypatch.setattr(m.blocks[i], name, getattr(m.blocks[src], name))
        monkeypatch.setattr(m, "kv_source", list(range(6)))
        # and a cache with their slots (the model's own has none for them)
        from minfer.models.gemma4 import with_kv_layers
        from minfer.runtime.kv_cache import KVCache
        own = with_kv_layers(m.cfg, [(m.kv_heads[i], m.head_dims[i], m.head_dims[i]) for i in range(6)])
        monkeypatch.setattr(eng, "cache", KVCache.for_config(own, eng.cache.n_ctx))
    if what == "shared_reads_last_layer":         # window queries (head size 16) over the global cache (32):
        with pytest.raises(RuntimeError):         # the per-layer cache holds each layer's own head size
            miss(eng)
        return
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("tensor", ["per_layer_token_embd.weight", "per_layer_model_proj.weight",
                                    "per_layer_proj_norm.weight", "blk.3.inp_gate.weight", "blk.0.proj.weight",
                                    "blk.5.post_norm.weight", "blk.1.attn_k.weight", "blk.0.attn_v.weight",
                                    "blk.4.attn_q.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    """(A global layer's attn_v is optional, as in llama.cpp: without it k serves as v, the 31B's form.)"""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


U32 = gguf.GGUFValueType.UINT32


@pytest.mark.parametrize("shared", [2, 5])
def test_shared_layer_patterns_refused_by_the_key(tmp_path, shared):
    """2: layer 4 (window) would reuse layer 2 (global) by llama.cpp's rule, layer 3 by HF's; 5: one
    layer with its own cache (llama.cpp needs two)."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"gemma4.attention.shared_kv_layers": (shared, U32)})
    with pytest.raises(MinferError, match=r"gemma4\.attention\.shared_kv_layers"):
        load(p)


def test_feed_forward_length_array_must_cover_the_layers(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"gemma4.feed_forward_length": ([96, 96, 96, 192], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"gemma4\.feed_forward_length"):
        load(p)
