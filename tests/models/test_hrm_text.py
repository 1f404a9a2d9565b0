"""HRM-Text (minfer/models/hrm_text.py) against transformers, on the CPU's float32 reference: the layout and the
KV-cache slot mapping read from the file, each rule of the graph needed (with one changed the logits miss by more
than 10x the tolerance), the per-pass cache slots needed once the sequence comes in pieces, the optional keys as
llama.cpp reads them, what the model does not support refused by name. The logits, greedy continuation, cache in
pieces and the batch engine's paged cache are test_arch_vs_transformers' (name "hrm-text").

Fixture: tests/data/arch/hrm-text.gguf (tools/gen_arch_fixtures.py: transformers' HrmTextForCausalLM, 2 layers per
stack, H_cycles 2, L_cycles 2, so block_count 12 slots over 4 weight blocks; embedding_scale 4; z_L_init random;
converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "hrm-text"
BASE_ERR = 6e-6        # the fixture's float32 miss (5.7e-6 whole, 7.1e-6 in pieces)
U32, F32, BOOL = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def miss_in_pieces(eng, cuts=(1, 2, 4, 5, 14, 15, 23)) -> float:
    r = ref(NAME)
    ids = r["ids"].tolist()
    cuts = [0, *cuts, len(ids)]
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    return rel_err(got, r["logits"])


def test_layout_read_from_the_file():
    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert (m.lps, m.h_cycles, m.l_cycles) == (2, 2, 2)
    assert c.n_layers == 12 and len(m.blocks) == 4          # 12 cache slots, 2 stacks of 2 weight blocks
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.d_model, c.ffn) == (4, 4, 16, 64, 96)
    assert c.rope.style == "neox" and c.rope.n_rot == 16
    assert m.embed_scale == 4.0 and m.z_l_init.shape == (64,) and not torch.all(m.z_l_init == 0)
    assert not c.tied_output and m.output is not m.token_embd
    assert type(m).paged_kv and not type(m).recurrent
    # the passes in the order the forward runs them: L, L, H per H cycle; each takes the next lps slots
    order = [m.slot(h, l, j) for h in range(2) for l in range(3) for j in range(2)]
    assert order == list(range(12))
    assert miss(eng) < 2 * BASE_ERR


@pytest.mark.parametrize("what", ["no_attn_gate", "no_embed_scale", "zero_z_l_init", "no_stack_norm",
                                  "norm_rope", "one_l_pass", "one_h_cycle", "stacks_swapped", "h_pass_first"])
def test_each_rule_is_needed(monkeypatch, what):
    """The sigmoid attention gate, the embedding scale, z_L_init, each stack's final weight-less norm, NEOX rope
    (not NORM pairs), both cycle counts, blocks 0..lps-1 as the L stack (not the H), and L passes before the H pass
    in each cycle."""
    from dataclasses import replace

    from minfer import ops
    from minfer.models.layers import attention_heads

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < 2 * BASE_ERR
    if what == "no_attn_gate":
        monkeypatch.setattr(m, "attention", lambda h, blk, slot, cache, step, ctx: ops.linear(
            attention_heads(h, blk, m.cfg, cache, slot, step, ctx), blk.attn_output, None, ctx))
    elif what == "no_embed_scale":
        m.embed_scale = 1.0
    elif what == "zero_z_l_init":
        m.z_l_init = torch.zeros_like(m.z_l_init)
    elif what == "no_stack_norm":
        monkeypatch.setattr(m, "stack_norm", lambda x, f, ctx: x + f)
    elif what == "norm_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))    # (this engine's own cfg)
    elif what == "one_l_pass":
        m.l_cycles = 1
    elif what == "one_h_cycle":
        m.h_cycles = 1
    elif what == "stacks_swapped":
        m.blocks = m.blocks[2:] + m.blocks[:2]
    else:                      # each cycle's H pass before its L passes (zH = H(zH + zL) with the previous zL)
        real = m.stack
        order = []

        def stack(x, which, base, cache, step, ctx, last=False):
            order.append(which)
            return real(x, which, base, cache, step, ctx, last=last)
        monkeypatch.setattr(m, "stack", stack)
        miss(eng)
        assert order == [0, 0, 1, 0, 0, 1]
        monkeypatch.setattr(m, "forward", lambda tokens, step, cache, ctx=None: _h_first_forward(
            m, tokens, step, cache, ctx))
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


def _h_first_forward(m, tokens, step, cache, ctx):
    from minfer import ops

    zh = ops.embedding(tokens, m.token_embd) * m.embed_scale
    zl = m.z_l_init.expand_as(zh)
    for hc in range(m.h_cycles):
        zh = m.stack(zh + zl, 1, m.slot(hc, m.l_cycles, 0), cache, step, ctx)
        for lc in range(m.l_cycles):
            zl = m.stack(zh + zl, 0, m.slot(hc, lc, 0), cache, step, ctx)
    return ops.linear(step.rows(zh), m.output, None, ctx, out_dtype=torch.float32)


def test_each_pass_needs_its_own_cache_slots(monkeypatch):
    """Every pass writes its keys/values to its own slots (block_count = lps * H_cycles * (L_cycles + 1)): with the
    passes of one stack sharing the stack's lps slots, a whole sequence in one forward still gives transformers'
    logits (each pass writes all its rows before it attends), but in pieces the earlier positions' rows are the last
    pass's, and the logits miss."""
    eng = engine(NAME)
    m = eng.model
    assert miss_in_pieces(eng) < 2 * BASE_ERR
    monkeypatch.setattr(m, "slot", lambda h, l, j: (m.lps if l == m.l_cycles else 0) + j)
    assert miss(eng) < 2 * BASE_ERR
    assert miss_in_pieces(eng) > 10 * TOL


def test_optional_keys_as_llama_cpp_reads_them(tmp_path):
    """hrm.prefix_lm is not read (llama.cpp and minfer run causal attention either way: the same logits); without
    embedding_scale the embedding is not scaled (llama-graph.cpp build_inp_embd: only when != 0), which misses
    this file's reference; without output.weight the lm head is token_embd (hrm-text.cpp: TENSOR_DUPLICATED)."""
    src = DATA / f"{NAME}.gguf"
    p = rewrite(src, tmp_path / "causal.gguf", set_keys={"hrm_text.hrm.prefix_lm": (False, BOOL)})
    assert _file_miss(p) < 2 * BASE_ERR
    p = rewrite(src, tmp_path / "noscale.gguf", drop_keys=("hrm_text.embedding_scale",))
    m = load(p)
    assert m.embed_scale == 1.0
    assert _file_miss(p) > 10 * TOL
    m = load(rewrite(src, tmp_path / "tied.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd


def _file_miss(path) -> float:
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(path, ctx=64, progress=False, switches=reference_switches())
    return miss(eng)


def _refused(tmp_path, match, **kw):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match):
        load(p)


@pytest.mark.parametrize("key", ["hrm_text.hrm.layers_per_stack", "hrm_text.hrm.h_cycles", "hrm_text.hrm.l_cycles"])
def test_missing_key_is_named(tmp_path, key):
    _refused(tmp_path, key.replace(".", r"\.") + ".*missing", drop_keys=(key,))


@pytest.mark.parametrize("tensor", ["hrm.z_l_init", "blk.1.attn_gate.weight", "blk.3.ffn_down.weight",
                                    "blk.2.attn_q.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    _refused(tmp_path, tensor.replace(".", r"\."), drop_tensors=(tensor,))


def test_refusals_by_name(tmp_path):
    """A block_count other than the slot count, a zero cycle count, GQA, a negative embedding scale, a fifth weight
    block, a fused attn_qkv, and tensors the graph does not read (a norm weight, an o bias)."""
    _refused(tmp_path, r"hrm_text\.block_count.*12", set_keys={"hrm_text.block_count": (8, U32)})
    _refused(tmp_path, r"hrm_text\.hrm\.l_cycles", set_keys={"hrm_text.hrm.l_cycles": (0, U32)})
    _refused(tmp_path, r"hrm_text\.attention\.head_count_kv", set_keys={"hrm_text.attention.head_count_kv": (2, U32)})
    _refused(tmp_path, r"hrm_text\.embedding_scale", set_keys={"hrm_text.embedding_scale": (-1.0, F32)})
    _refused(tmp_path, r"blocks \[0, 1, 2, 3, 4\]", add_tensors={"blk.4.attn_q.weight": np.zeros((64, 64))})
    _refused(tmp_path, r"blk\.0\.attn_qkv\.weight", add_tensors={"blk.0.attn_qkv.weight": np.zeros((192, 64))})
    _refused(tmp_path, r"blk\.0\.attn_norm\.weight", add_tensors={"blk.0.attn_norm.weight": np.ones(64)})
    _refused(tmp_path, r"blk\.1\.attn_output\.bias", add_tensors={"blk.1.attn_output.bias": np.zeros(64)})
