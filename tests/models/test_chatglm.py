"""ChatGLM / GLM-4-9B-chat (minfer/models/chatglm.py) against transformers, on the CPU's float32 reference: each
rule of the graph needed (with one changed the logits miss by more than 10x the tolerance), the fused attn_qkv
form of the remote-code releases equal to the separate one, what the model needs refused by name when missing.
The logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name
"chatglm"). Fixture: tests/data/arch/chatglm.gguf (tools/gen_arch_fixtures.py: transformers' GlmForCausalLM,
partial rotary 0.5, q/k/v biases, GQA 2:1, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

NAME = "chatglm"
BASE_ERR = 9.5e-7      # the fixture's float32 miss


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn) == (16, 4, 2, 64, 96)
    assert c.rope.style == "normal" and c.rope.n_rot == 8 and c.rope.theta == 10000.0
    assert not c.tied_output
    b = m.blocks[0]
    assert b.ffn_gate is None and b.ffn_up.shape == (192, 64) and b.attn_qkv is None
    assert b.attn_q_bias.shape == (64,) and b.attn_k_bias.shape == (32,)
    assert not hasattr(b, "post_attention_norm")      # GLM-4-0414's post-norms are not in this graph


@pytest.mark.parametrize("what", ["neox", "full_rotation", "no_qkv_bias", "up_gate_order", "glm4_post_norms"])
def test_each_rule_is_needed(monkeypatch, what):
    """NORM pairs (not NEOX halves), the rotation of half of each head, the q/k/v biases, the fused gate-then-up
    order, and no post-norms (GLM-4-0414's, with the pre-norms' weights, as a glm4 reading would apply them)."""
    from minfer import ops

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "neox":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))    # (this engine's own cfg)
    elif what == "full_rotation":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "no_qkv_bias":
        for b in m.blocks:
            for k in ("attn_q_bias", "attn_k_bias", "attn_v_bias"):
                monkeypatch.setattr(b, k, None)
    elif what == "up_gate_order":
        F = m.cfg.ffn
        for b in m.blocks:     # the reference path multiplies by the dense weight
            monkeypatch.setattr(b.ffn_up, "dense", torch.cat([b.ffn_up.dense[F:], b.ffn_up.dense[:F]]))
    else:                      # an RMSNorm on the attention branch before its residual add
        real = m.attention
        monkeypatch.setattr(m, "attention", lambda h, blk, i, cache, step, ctx: ops.rms_norm(
            real(h, blk, i, cache, step, ctx).float(), blk.ffn_norm, m.cfg.rms_eps))
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


def fused_file(tmp_path, bias: str):
    """The fixture with each layer's q/k/v as one attn_qkv (rows q, k, v, as the remote-code releases'
    query_key_value) and its biases: 'fused' as attn_qkv.bias, 'separate' the attn_{q,k,v}.bias kept."""
    import gguf

    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    drop, add = [], {}
    for i in range(2):
        p = f"blk.{i}."
        drop += [p + f"attn_{x}.weight" for x in "qkv"]
        add[p + "attn_qkv.weight"] = np.concatenate([t[p + f"attn_{x}.weight"] for x in "qkv"])
        if bias == "fused":
            drop += [p + f"attn_{x}.bias" for x in "qkv"]
            add[p + "attn_qkv.bias"] = np.concatenate([t[p + f"attn_{x}.bias"] for x in "qkv"])
    return rewrite(DATA / f"{NAME}.gguf", tmp_path / "fused.gguf", drop_tensors=tuple(drop), add_tensors=add)


@pytest.mark.parametrize("bias", ["fused", "separate"])
def test_fused_qkv_equals_separate(tmp_path, bias):
    """glm-4-9b-chat / chatglm3-6b (ChatGLMModel, remote code) convert with a fused attn_qkv (llama.cpp's
    create_tensor_qkv takes it, with attn_qkv.bias or the separate biases); the same weights give transformers'
    logits, in pieces through the cache too."""
    from minfer.runtime.engine import Engine

    eng = Engine.load(fused_file(tmp_path, bias), ctx=64, progress=False, switches=reference_switches())
    b = eng.model.blocks[0]
    assert b.attn_qkv is not None and b.attn_q is None
    assert (b.attn_qkv_b is not None) == (bias == "fused") and (b.attn_q_bias is not None) == (bias == "separate")
    assert miss(eng) < 10 * BASE_ERR
    r = ref(NAME)
    ids = r["ids"].tolist()
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in ((0, 7), (7, 8), (8, len(ids)))])
    assert rel_err(got, r["logits"]) < TOL


def test_fused_qkv_batch_engine_greedy(tmp_path):
    """The fused form through the batch engine's paged cache (blocks of 4), next to a second sequence: transformers'
    greedy continuation."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    eng = Engine.load(fused_file(tmp_path, "fused"), ctx=64, progress=False, switches=reference_switches())
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    n = len(r["greedy"])
    outs = be.generate_many([r["prompt"].tolist(), r["ids"][10:25].tolist()], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["greedy"].tolist()


def test_fused_qkv_row_order_is_needed(tmp_path, monkeypatch):
    """The fused rows are q, then k, then v: with k's rows read as v's and v's as k's the logits miss."""
    from minfer.runtime.engine import Engine

    eng = Engine.load(fused_file(tmp_path, "fused"), ctx=64, progress=False, switches=reference_switches())
    c = eng.model.cfg
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    for b in eng.model.blocks:
        w, bias = b.attn_qkv.dense, b.attn_qkv_b
        monkeypatch.setattr(b.attn_qkv, "dense", torch.cat([w[:q], w[q + kv:], w[q:q + kv]]))
        monkeypatch.setattr(b, "attn_qkv_b", torch.cat([bias[:q], bias[q + kv:], bias[q:q + kv]]))
    assert miss(eng) > 10 * TOL


def test_the_biases_are_optional(tmp_path):
    """create_tensor_qkv takes the biases as TENSOR_NOT_REQUIRED: a file without them loads (and misses
    transformers, whose model has them)."""
    drop = tuple(f"blk.{i}.attn_{x}.bias" for i in range(2) for x in "qkv")
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=drop))
    assert m.blocks[1].attn_v_bias is None


def test_tied_head_without_output(tmp_path):
    """chatglm.cpp takes `output` as TENSOR_NOT_REQUIRED and falls back to token_embd (glm-edge style ties)."""
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd


def test_q_width_other_than_d_is_refused(tmp_path):
    import gguf

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"chatglm.attention.key_length": (32, gguf.GGUFValueType.UINT32),
                          "chatglm.attention.value_length": (32, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match="chatglm's q width 4 x 32 differs from embedding_length 64"):
        load(p)


@pytest.mark.parametrize("key", ["chatglm.attention.layer_norm_rms_epsilon", "chatglm.block_count",
                                 "chatglm.feed_forward_length", "chatglm.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.1.ffn_up.weight", "blk.0.attn_k.weight", "blk.1.ffn_norm.weight",
                                    "blk.0.attn_output.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_fused_qkv_cuda_backend_in_the_interpreter(tmp_path, monkeypatch):
    """The fused attn_qkv form (the released glm-4-9b-chat GGUFs') through the CUDA backend's code in Triton's
    interpreter: the eager prefill and the host-free decode step within 1e-5 of the reference forward (the
    separate form is tests/ops/test_arch_forward_interpreted.py's "chatglm")."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "ops"))
    from kernel_data import interpreted_modules, route_to_cuda

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    m = load_model(GGUFFile(fused_file(tmp_path, "fused")), progress=False)
    assert m.blocks[0].attn_qkv is not None
    toks = torch.arange(3, 13) * 7 % 300 + 3
    T = len(toks)
    ref_cache, cache = KVCache.for_config(m.cfg, 64), KVCache.for_config(m.cfg, 64)
    ref = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)
    mods = interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                "minfer.ops.cuda.attention", "minfer.ops.cuda"])
    C = next(mods)["cuda"]
    try:
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        paths.reset()
        out = m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
        dec = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
        taken = set(paths.snapshot()["counts"])
    finally:
        monkeypatch.undo()
        next(mods, None)          # the modules reloaded as they were

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5
    assert {"rope.triton", "attention.decode.triton"} <= taken, taken
