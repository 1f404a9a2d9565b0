"""Google Gemma 3n, the text model (minfer/models/gemma3n.py): AltUp's four streams, LAuReL, per-layer
embeddings, shared-KV layers, activation sparsity, window / global layers, q/k/v norms and the final soft-cap,
against transformers on the CPU's float32 reference (the logits, greedy, cache-in-pieces and paged-cache tests
are tests/models/test_arch_vs_transformers.py's): each rule needed (with one changed the logits miss by more
than 10x the tolerance), malformed files refused by name. Fixture: tests/data/arch/gemma3n.gguf
(tools/gen_arch_fixtures.py: Gemma3nForCausalLM, 6 layers [window, window, global] x 2, layers 3-5 sharing
the caches of layers 1 (window) and 2 (global), sparsity 0.95 on layers 0 and 1, LAuReL rank 16, 16
per-layer embedding dims per layer)."""

from __future__ import annotations

import math

import gguf
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "gemma3n"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    m = engine(NAME).model
    assert m.is_local == (True, True, False, True, True, False) and m.window == 8
    assert [r.theta for r in m.layer_rope] == [20000.0, 20000.0, 1e6, 20000.0, 20000.0, 1e6]
    assert m.kv_source == [0, 1, 2, 1, 1, 2]
    assert [b.attn_k is None for b in m.blocks] == [False] * 3 + [True] * 3
    c = -math.sqrt(2) * torch.erfinv(torch.tensor(1 - 2 * 0.95)).item()     # icdf(0.95) = 1.6449
    assert m.sparsity[:2] == pytest.approx([c, c], rel=1e-6) and m.sparsity[2:] == [None] * 4
    assert m.n_altup == 4 and m.ple_dim == 16 and m.laurel_l[0].shape == (16, 64)
    cache = KVCache.for_config(m.cfg, 64)
    m.forward(torch.arange(3, 23), Step.at(0, 20, "cpu"), cache)
    assert cache.k[3] is cache.k[4] is cache.k[5] is None                   # the shared layers own no cache


def _y_rule(what):
    """The layer's pre-FFN residual y from (a, attn, laurel input h, laurel output lr) with one rule changed."""
    def y(a, attn, h, lr):
        if what == "no_laurel":
            return a + attn
        if what == "laurel_without_residual":
            return (a + attn + (lr - h.float())) / math.sqrt(2.0)
        return a + attn + lr        # no_sqrt2
    return y


def _forward_with(m, what):
    """m's forward with one rule changed (gemma3n.py's forward, step by step)."""
    from minfer.models import gemma3n

    def forward(tokens, step, cache, ctx=None):
        eps = m.cfg.rms_eps
        x0 = ops.embedding(tokens, m.token_embd) * m.embed_scale
        ple = m._per_layer_inputs(tokens, x0, ctx)
        if what == "streams_unscaled":
            X = torch.cat([x0.unsqueeze(0), torch.einsum("ked,td->kte", m.altup_proj, x0)])
        elif what == "streams_all_x0":
            X = x0.unsqueeze(0).repeat(m.n_altup, 1, 1)
        else:
            X = m._streams(x0)
        for i, blk in enumerate(m.blocks):
            P = X if what == "no_predict" else m._altup_predict(X, i)
            a = P[0]
            h = ops.rms_norm(a, blk.attn_norm, eps)
            lr = m._laurel(h, i, ctx)
            attn = ops.rms_norm(m._attention(h, blk, i, cache, step, ctx), m.post_attention_norm[i], eps)
            if what in ("no_laurel", "laurel_without_residual", "no_sqrt2"):
                y = _y_rule(what)(a, attn, h, lr)
            else:
                y = (a + attn + lr) / math.sqrt(2.0)
            hn = ops.rms_norm(y, blk.ffn_norm, eps)
            gate, up = ops.linear(hn, blk.ffn_gate), ops.linear(hn, blk.ffn_up)
            c = m.sparsity[i]
            if c is not None and what != "no_sparsity":
                if what == "sparsity_std_unbiased":         # llama.cpp gaussian_topk's 1 / (n - 1)
                    cut = gate.mean(-1, keepdim=True) + gate.std(-1, keepdim=True, unbiased=True) * c
                    gate = torch.relu(gate - cut)
                else:
                    gate = gemma3n.gaussian_topk(gate, c)
            o = y + ops.rms_norm(ops.linear(ops.geglu(gate, up), blk.ffn_down), m.post_ffw_norm[i], eps)
            if what == "no_correct":
                X = P.clone()
                X[0] = o
            elif what == "correct_without_one":
                coefs = m._modalities(o, i) @ m.altup_correct[i].t()
                X = P + coefs.t().unsqueeze(-1) * (o - P[0]).unsqueeze(0)
            else:
                X = m._altup_correct(P, o, i)
            first = X[0] if what != "no_correct_scale" else X[0] / m.altup_correct_scale[i]
            pl = m._per_layer_out(first, i, ple, ctx)
            if what == "no_per_layer_branch":
                pass
            elif what == "per_layer_on_every_stream":
                X = X + pl.unsqueeze(0)
            else:
                X = torch.cat([X[:1], X[1:] + pl.unsqueeze(0)])
        if what == "merge_stream0_only":
            z = X[0]
        elif what == "merge_unscaled":
            z = torch.cat([X[:1], torch.einsum("ked,ktd->kte", m.altup_unembd, X[1:])]).mean(0)
        else:
            z = m._merge(X)
        logits = ops.linear(ops.rms_norm(step.rows(z), m.output_norm, eps), m.output)
        return m.final_softcap * torch.tanh(logits / m.final_softcap)
    return forward


FORWARD_RULES = ["streams_unscaled", "streams_all_x0", "no_predict", "no_laurel", "laurel_without_residual",
                 "no_sqrt2", "no_sparsity", "sparsity_std_unbiased", "no_correct", "correct_without_one",
                 "no_correct_scale", "no_per_layer_branch", "per_layer_on_every_stream", "merge_stream0_only",
                 "merge_unscaled"]
OTHER_RULES = ["router_unscaled", "laurel_no_norm", "no_per_layer_inputs_token_part", "no_kv_sharing",
               "shared_window_reads_layer0", "no_window", "no_final_softcap", "v_unnormed"]


def test_the_forward_copy_is_the_model():
    """The rule tests' step-by-step forward, unchanged, gives the model's logits (so a miss is the rule's)."""
    eng = engine(NAME)
    r = ref(NAME)
    got = eng.logits(r["ids"].tolist()).numpy()
    eng2 = engine(NAME)
    eng2.model.forward = _forward_with(eng2.model, "none")
    assert rel_err(eng2.logits(r["ids"].tolist()).numpy(), got) < 1e-5


@pytest.mark.parametrize("what", FORWARD_RULES + OTHER_RULES)
def test_each_rule_is_needed(monkeypatch, what):
    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what in FORWARD_RULES:
        monkeypatch.setattr(m, "forward", _forward_with(m, what))
    elif what == "router_unscaled":                  # the router input without its 1/D (HF router_input_scale)
        monkeypatch.setattr(m, "_modalities", lambda z, i: torch.tanh(
            ops.rms_norm(z, m.altup_router_norm[i], m.cfg.rms_eps) @ m.altup_router[i].t()))
    elif what == "laurel_no_norm":
        monkeypatch.setattr(m, "_laurel", lambda h, i, ctx: h + ops.linear(ops.linear(h, m.laurel_l[i]), m.laurel_r[i]))
    elif what == "no_per_layer_inputs_token_part":   # the per-layer inputs from the context projection only
        real = type(m)._per_layer_inputs

        def ple(tokens, x0, ctx):
            T, L, P = tokens.shape[0], m.cfg.n_layers, m.ple_dim
            tok = ops.embedding(tokens, m.ple_token_embd).view(T, L, P) * math.sqrt(P)
            return real(m, tokens, x0, ctx) - tok / math.sqrt(2.0)
        monkeypatch.setattr(m, "_per_layer_inputs", ple)
    elif what == "no_kv_sharing":                    # the shared layers with k/v of their own (the producer's weights)
        for i, src in ((3, 1), (4, 1), (5, 2)):
            for name in ("attn_k", "attn_v", "attn_k_norm"):
                monkeypatch.setattr(m.blocks[i], name, getattr(m.blocks[src], name))
        monkeypatch.setattr(m, "kv_source", list(range(6)))
        from minfer.models.gemma4 import with_kv_layers
        from minfer.runtime.kv_cache import KVCache
        own = with_kv_layers(m.cfg, [(m.kv_heads[i], m.head_dims[i], m.head_dims[i]) for i in range(6)])
        monkeypatch.setattr(eng, "cache", KVCache.for_config(own, eng.cache.n_ctx))
    elif what == "shared_window_reads_layer0":       # the first window layer's cache, not the last one's
        monkeypatch.setattr(m, "kv_source", [0, 1, 2, 0, 0, 2])
    elif what == "no_window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "no_final_softcap":
        monkeypatch.setattr(m, "final_softcap", 0.0)
    else:                                            # v without its weightless RMSNorm
        real_kv = type(m)._kv

        def kv(h, blk, i, step, ctx):
            k, _ = real_kv(m, h, blk, i, step, ctx)
            return k, ops.linear(h, blk.attn_v).view(h.shape[0], m.kv_heads[i], m.head_dims[i])
        monkeypatch.setattr(m, "_kv", kv)
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("tensor", ["altup_proj.weight", "altup_unembd_proj.weight", "per_layer_token_embd.weight",
                                    "per_layer_model_proj.weight", "blk.1.altup_router.weight",
                                    "blk.2.altup_router_norm.weight", "blk.3.altup_predict_coef.weight",
                                    "blk.4.altup_correct_coef.weight", "blk.0.altup_correct_scale.weight",
                                    "blk.5.laurel_l.weight", "blk.1.laurel_r.weight", "blk.2.laurel_post_norm.weight",
                                    "blk.0.inp_gate.weight", "blk.3.proj.weight", "blk.4.post_norm.weight",
                                    "blk.2.attn_v.weight", "blk.1.attn_k.weight", "blk.4.attn_q.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["gemma3n.altup.num_inputs", "gemma3n.altup.active_idx",
                                 "gemma3n.activation_sparsity_scale", "gemma3n.attention.sliding_window_pattern",
                                 "gemma3n.embedding_length_per_layer_input", "gemma3n.attention.sliding_window"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


U32, F32, ARR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize("key,value,match", [
    ("gemma3n.altup.active_idx", (1, U32), r"gemma3n\.altup\.active_idx=1"),
    # three streams: the stream projections hold two matrices, the file's three
    ("gemma3n.altup.num_inputs", (3, U32), r"altup_proj\.weight' has shape"),
    ("gemma3n.attention.shared_kv_layers", (2, U32), r"gemma3n\.attention\.shared_kv_layers"),
    ("gemma3n.attention.shared_kv_layers", (5, U32), r"gemma3n\.attention\.shared_kv_layers"),
    ("gemma3n.activation_sparsity_scale", ([1.6, 1.6, 0.0], ARR), r"gemma3n\.activation_sparsity_scale"),
    ("gemma3n.attention.value_length", (32, U32), r"gemma3n\.attention\.value_length")])
def test_malformed_keys_refused_by_name(tmp_path, key, value, match):
    """shared_kv_layers 2: layer 4 (window) would reuse layer 2 (global) by llama.cpp's rule, layer 3 by HF's."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", set_keys={key: value})
    with pytest.raises(MinferError, match=match):
        load(p)
