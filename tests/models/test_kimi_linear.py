"""Kimi-Linear (minfer/models/kimi_linear.py, models/kda.py) against transformers, on the CPU's float32 reference:
each rule of the graph needed (with one changed the logits miss by more than 10x the tolerance), the chunked KDA
scan equal to the recurrence across chunk boundaries, what the model does not support refused by name. The logits,
greedy continuation and the cache in pieces are test_arch_vs_transformers' (name "kimi-linear"). Fixture:
tests/data/arch/kimi-linear.gguf (tools/gen_arch_fixtures.py: transformers' KimiLinearForCausalLM, KDA layers 0
and 2, MLA layers 1 and 3, a dense layer then sigmoid MoE, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "kimi-linear"
BASE_ERR = 1.1e-5      # the fixture's float32 miss (1.02e-5: HF's chunked KDA form against minfer's)


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert m.is_recurrent == (True, False, True, False)
    assert (m.kda_dims.n_heads, m.kda_dims.head_dim, m.kda_dims.d_conv) == (4, 24, 4)
    assert m.dims == (4, 32, 8, 16, 24)                  # H, kv_lora R, "rope" dims, qk_nope, v_head
    assert c.kv_layers == (None, (1, 40, 32), None, (1, 40, 32))
    assert c.state_layers[0] == ((4, 288), (2, 4, 24, 24)) and c.state_layers[1] is None
    assert m.gating == "sigmoid" and m.weights_norm and c.expert_weights_scale == pytest.approx(2.446)
    assert c.leading_dense_blocks == 1 and m.blocks[0].router is None and m.blocks[1].router is not None
    assert m.kq_scale == pytest.approx(1 / math.sqrt(24))
    assert type(m).paged_kv and type(m).recurrent
    assert miss(engine(NAME)) < 2 * BASE_ERR


def test_mla_rows_keep_v_in_k():
    """The MLA layers' V is the view of their K rows' first R = 32 dims (one store, as deepseek2's latent cache):
    the single-sequence cache and the paged one; a KDA layer keeps no rows; the preflight's bytes count K only."""
    from minfer.runtime.kv_cache import KVCache, kv_bytes_per_position
    from minfer.runtime.paged_kv import PagedKVCache

    c = engine(NAME).model.cfg
    assert c.cache_v_in_k == 32
    assert kv_bytes_per_position(c, 2) == 2 * 2 * 40
    for cache in (KVCache.for_config(c, 16), PagedKVCache.for_config(c, 4, 4)):
        assert cache.v_is_view() and cache.k[0] is None and cache.v[0] is None
        k3, v3 = cache.k[3], cache.v[3]
        assert k3.shape[1:] == (1, 40) and v3.shape[1:] == (1, 32) and v3.data_ptr() == k3.data_ptr()
        st = cache.states.nbytes() if isinstance(cache, PagedKVCache) else \
            sum(t.numel() * 4 for g in cache.states if g is not None for t in g)
        assert cache.nbytes() - st == k3.numel() * 2 * k3.element_size()     # layers 1 and 3, K only
    short = KVCache.for_config(c, 16).rows_view(8)
    assert short.v_is_view() and short.v[1].data_ptr() == short.k[1].data_ptr()


def _with_rope(m, monkeypatch):
    """deepseek2's MLA (rope on q_pe and k_pe) on the MLA layers."""
    from minfer.models.deepseek2 import Deepseek2Model

    real = m.attention
    m.rope, m.rope_scale = m.cfg.rope, 1.0
    monkeypatch.setattr(m, "attention", lambda h, b, i, cache, step, ctx, rope=None: real(h, b, i, cache, step, ctx)
                        if m.is_recurrent[i] else Deepseek2Model.attention(m, h, b, i, cache, step, ctx))


@pytest.mark.parametrize("what", ["rope", "scalar_decay", "silu_gate", "no_qk_l2norm", "scale_of_cache_rows",
                                  "no_renorm", "no_routed_scale", "no_select_bias", "no_shared_expert",
                                  "conv_q_k_swapped"])
def test_each_rule_is_needed(monkeypatch, what):
    """No rope on the MLA layers, KDA's per-channel decay (not one per head: deltanet.py's), the sigmoid output
    gate (not silu), the q/k l2 norms, the MLA scale 1/sqrt(qk_nope + qk_rope) (not of the cached row's width),
    the renormalized top-k weights, the routed scale 2.446, the selection bias, the shared expert, and each of
    q, k, v through its own conv."""
    from minfer.models import kda

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "rope":
        _with_rope(m, monkeypatch)
    elif what == "scalar_decay":
        for f in ("scan_chunked", "scan_sequential"):
            real = getattr(kda, f)
            monkeypatch.setattr(kda, f, lambda q, k, v, g, beta, *a, _r=real, **kw: _r(
                q, k, v, g.mean(-1, keepdim=True).expand_as(g), beta, *a, **kw))
    elif what == "silu_gate":
        monkeypatch.setattr(kda, "gated_norm", lambda o, gate, w, eps: o * torch.rsqrt(
            o.pow(2).mean(-1, keepdim=True) + eps) * w * torch.nn.functional.silu(gate))
    elif what == "no_qk_l2norm":
        monkeypatch.setattr(kda, "l2norm", lambda x: x)
    elif what == "scale_of_cache_rows":
        m.kq_scale = 1 / math.sqrt(m.cfg.head_dim)
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_routed_scale":
        object.__setattr__(m.cfg, "expert_weights_scale", 1.0)
    elif what == "no_select_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "select_bias", None)
    elif what == "no_shared_expert":
        for b in m.blocks:
            monkeypatch.setattr(b, "gate_shexp", None)
    else:
        N = m.kda_dims.inner
        for lw in m.kda:
            if lw is not None:
                monkeypatch.setattr(lw, "conv_w", torch.cat([lw.conv_w[:, N:2 * N], lw.conv_w[:, :N],
                                                             lw.conv_w[:, 2 * N:]], 1))
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_chunked_scan_equals_the_recurrence(chunk):
    """scan_chunked (the WY form with per-channel cumulative decays) against scan_sequential over 100 positions:
    chunk boundaries crossed, the state carried from chunk to chunk, and from one call to the next."""
    from minfer.models.kda import l2norm, scan_chunked, scan_sequential

    g = torch.Generator().manual_seed(0)
    T, H, Dh = 100, 3, 8
    q = l2norm(torch.randn(T, H, Dh, generator=g)) * Dh ** -0.5
    k = l2norm(torch.randn(T, H, Dh, generator=g))
    v = torch.randn(T, H, Dh, generator=g)
    gd = -torch.rand(T, H, Dh, generator=g) * torch.tensor([0.01, 0.3, 3.0]).view(1, H, 1)   # slow to fast decay
    beta = torch.rand(T, H, generator=g)
    ring_a, ring_b = torch.zeros(2, H, Dh, Dh), torch.zeros(2, H, Dh, Dh)
    pos = torch.arange(T)
    want = scan_sequential(q, k, v, gd, beta, ring_a, pos)
    got = torch.cat([scan_chunked(q[:60], k[:60], v[:60], gd[:60], beta[:60], ring_b, pos[:60], chunk=chunk),
                     scan_chunked(q[60:], k[60:], v[60:], gd[60:], beta[60:], ring_b, pos[60:], chunk=chunk)])
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert torch.allclose(ring_b[(T - 1) % 2], ring_a[(T - 1) % 2], atol=1e-5, rtol=1e-4)


def _refused(tmp_path, match, **kw):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match):
        load(p)


@pytest.mark.parametrize("key", ["kimi-linear.expert_gating_func", "kimi-linear.kda.head_dim",
                                 "kimi-linear.ssm.conv_kernel", "kimi-linear.attention.kv_lora_rank",
                                 "kimi-linear.attention.key_length_mla"])
def test_missing_key_is_named(tmp_path, key):
    _refused(tmp_path, key.replace(".", r"\."), drop_keys=(key,))


@pytest.mark.parametrize("tensor", ["blk.0.ssm_conv1d_k.weight", "blk.2.ssm_f_b.weight", "blk.0.ssm_dt.bias",
                                    "blk.1.attn_k_b.weight", "blk.3.exp_probs_b.bias", "blk.2.ssm_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    _refused(tmp_path, tensor.replace(".", r"\."), drop_tensors=(tensor,))


def test_refusals_by_name(tmp_path):
    """q_lora (attn_q_a), A_log stored as itself (ssm_a >= 0), a head_count_kv without an MLA layer, a KDA head
    size the conv tensors do not have, a fused attn_qkv on a KDA layer, the older unsplit attn_kv_b."""
    import gguf

    U32 = gguf.GGUFValueType.UINT32
    _refused(tmp_path, r"q_lora_rank", set_keys={"kimi-linear.attention.q_lora_rank": (16, U32)})
    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    a = -np.asarray(next(t for t in rd.tensors if t.name == "blk.0.ssm_a").data, dtype=np.float32)
    _refused(tmp_path, r"blk\.0\.ssm_a", drop_tensors=("blk.0.ssm_a",), add_tensors={"blk.0.ssm_a": a.reshape(4)})
    _refused(tmp_path, r"head_count_kv", set_keys={"kimi-linear.attention.head_count_kv": ([0, 0, 0, 0], gguf.GGUFValueType.ARRAY)})
    _refused(tmp_path, r"blk\.0\.ssm_conv1d_q\.weight", set_keys={"kimi-linear.kda.head_dim": (16, U32)})
    _refused(tmp_path, r"blk\.0\.attn_qkv\.weight", add_tensors={"blk.0.attn_qkv.weight": np.zeros((288, 64))})
    _refused(tmp_path, r"attn_kv_b", add_tensors={"blk.0.attn_kv_b.weight": np.zeros((160, 32))})


def test_kda_mixer_names_a_wrong_state():
    """The KDA mixer names what it got when the state is neither a KVCache's nor a BatchState."""
    from minfer.models.kda import kda_mixer

    m = engine(NAME).model
    with pytest.raises(MinferError, match="kimi-linear.*object"):
        kda_mixer(torch.zeros(1, 64), m.kda[0], m.kda_dims, object(), torch.tensor([0]), 1e-5, None)


def test_kda_state_slots_on_the_cpu_paged_reference():
    """The batch engine (`minfer serve -np N`, BatchEngine.from_engine): the CPU's paged cache (blocks of 4) runs the
    MLA rows (V in K) and the KDA state slots (decode rows batched by slot, prefill chunks on their slots' rings) to
    transformers' greedy continuation, next to a second sequence that matches its own single-sequence run."""
    from minfer.commands.serve import _one_at_a_time_if_unpaged
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    assert _one_at_a_time_if_unpaged(GGUFFile(DATA / f"{NAME}.gguf"), 2, 2, print) == 2    # -np 2 kept
    r = ref(NAME)
    eng = engine(NAME)
    BatchEngine.from_engine(eng, max_seqs=2)                         # no longer refused
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    assert be.cache.v_is_view()
    n = len(r["greedy"])
    other = r["ids"][10:25].tolist()
    outs = be.generate_many([r["prompt"].tolist(), other], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["greedy"].tolist()
    single = [ev.token_id for ev in eng.generate(other, SamplingParams(temperature=0), max_new_tokens=n)]
    assert [ev.token_id for ev in outs[1]] == single
