"""The Qwen3.5 family (qwen35, qwen35moe, qwen3next: gated DeltaNet + gated attention) in the batch
engine: per-sequence state slots beside the paged cache (runtime/paged_state.py, models/deltanet.py
conv_scan_batch), as the Mamba-2 hybrids' (tests/runtime/test_paged_recurrent.py, whose helpers
these tests use).

Batched greedy of three prompts of different lengths, split into chunks by a small token budget
(decode rows of some sequences next to prefill chunks of others in one step), equals each prompt's
single-sequence greedy, logits within float32 rounding (max |diff| / max |logit| < 1e-4: the
prefill's chunks are cut elsewhere than the single prefill's, and the delta rule's triangular
solve rounds by chunk); also with held steps and under preemption,
and through the decode graphs' static bucket tensors. The decode rows' step reads no host value (it
runs on the meta device, where any read of a value raises). A slot a finished sequence gave back
starts clean (and does not when the zeroing is skipped); the state slots are counted in the
cache's bytes and the preflight."""

from __future__ import annotations

import pytest
import torch
from models.test_arch_vs_transformers import DATA, engine, rel_err
from runtime.test_paged_recurrent import CTX, _batch, _prompts, _single

from minfer.errors import MinferError
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.kv_cache import state_bytes
from minfer.runtime.paged_kv import PagedKVCache
from minfer.runtime.paged_state import PagedStatePool, pool_state_bytes

NAMES = ["qwen35", "qwen35moe", "qwen3next"]
_engines: dict = {}


def _engine(name):
    if name not in _engines:
        _engines[name] = engine(name, ctx=CTX)
    return _engines[name]


@pytest.mark.parametrize("name", NAMES)
def test_batched_greedy_equals_single(name):
    eng = _engine(name)
    prompts = _prompts(name)                                    # 23, 7 and 38 tokens
    be, toks, logits = _batch(eng, prompts)
    assert be.stats["steps"] > 8                                # chunked: 68 prompt tokens, budget 10
    assert be.stats["decode_rows"] > 0 and be.stats["prefill_tokens"] == sum(map(len, prompts))
    assert be.cache.states is not None and be.blocks.prefix_cache is False
    for p, t, lg in zip(prompts, toks, logits):
        st, sl = _single(eng, p)
        assert t == st
        for a, b in zip(lg, sl):          # chunks cut elsewhere than the single prefill's: ~1.5e-5 here
            assert rel_err(a[None].numpy(), b[None].numpy()) < 1e-4
    assert be.cache.states.n_free == 3                          # every slot back


def test_held_steps_preemption_and_decode_buckets(monkeypatch):
    """qwen3next with held steps (chained decode rows launched from device tokens), with a pool too
    small for all three (preemption recomputes from 0 into a fresh slot), and with decode-only steps
    through batch_graphs' static bucket tensors (3 rows padded to 4, the padding row in state slot 0;
    the graph's replay standing in for an eager forward over those tensors): the same tokens."""
    from minfer.runtime.batch_graphs import BatchDecodeGraphs

    eng = _engine("qwen3next")
    prompts = _prompts("qwen3next")
    single = [_single(eng, p, 12)[0] for p in prompts]
    be, toks, _ = _batch(eng, prompts, n=12, async_steps=True)
    assert be.stats["chained_steps"] > 0 and toks == single
    be, toks, _ = _batch(eng, prompts, n=12, n_blocks=20)
    assert be.scheduler.n_preemptions > 0 and toks == single

    class Eager:
        def __init__(self, graphs, b):
            self.graphs, self.b = graphs, b

        def replay(self):
            self.b.logits = self.graphs._forward(self.b)

    monkeypatch.setattr(BatchDecodeGraphs, "_capture", lambda self, b: setattr(b, "graph", Eager(self, b)))
    be, toks, _ = _batch(eng, prompts, n=12, buckets=[1, 2, 4])
    assert be.stats["graph_steps"] > 0
    assert be.graphs._by_size[4].step.state_slots is not None
    assert toks == single


def test_decode_rows_read_no_host_value():
    """The decode rows' conv + delta-rule step (what a batched decode graph captures) on the meta
    device: slots and positions are device tensors whose values cannot be read there, so any host
    read (.item(), int(), a Python branch on a value) would raise. Shapes come out right and the
    pools are written in place."""
    from dataclasses import replace

    from minfer.models.deltanet import conv_scan_batch
    from minfer.runtime.paged_state import BatchState

    m = _engine("qwen35").model
    d, w = m.dims, m.linear[0]
    meta = torch.device("meta")
    w = replace(w, conv_w=w.conv_w.to(meta), dt_bias=w.dt_bias.to(meta), A=w.A.to(meta), norm=w.norm.to(meta))
    S, B = 5, 3
    conv = torch.zeros((S, d.d_conv, d.conv_dim), device=meta)
    ssm = torch.zeros((S, 2, d.n_v_heads, d.d_state, d.v_dim), device=meta)
    st = BatchState(conv, ssm, B, torch.zeros(B, dtype=torch.long, device=meta), [])
    qkv = torch.empty((B, d.conv_dim), device=meta)
    g, beta = torch.empty((B, d.n_v_heads), device=meta), torch.empty((B, d.n_v_heads), device=meta)
    for tiled in (True, False):
        o = conv_scan_batch(qkv, g, beta, w, d, st, torch.zeros(B, dtype=torch.long, device=meta), tiled)
        assert o.shape == (B, d.n_v_heads, d.v_dim) and o.device == meta
    with pytest.raises(Exception):                              # the guard itself: a host read raises
        int(st.decode_slots[0])


def test_reused_slot_starts_clean(monkeypatch):
    """One slot (max_seqs 1): the second prompt takes the slot the first gave back. Zeroed, it equals
    its single greedy; with the zeroing skipped it reads the first sequence's state and differs."""
    eng = _engine("qwen35")
    a, b = _prompts("qwen35")[2], _prompts("qwen35")[1]         # 38 tokens, then 7 (< one chunk of the ring)
    want, want_logits = _single(eng, b)
    _, toks, logits = _batch(eng, [a, b], max_seqs=1)
    assert toks[1] == want
    assert rel_err(logits[1][0][None].numpy(), want_logits[0][None].numpy()) < 1e-4
    monkeypatch.setattr(PagedStatePool, "zero", lambda self, slot: None)
    _, toks, logits = _batch(eng, [a, b], max_seqs=1)
    assert (logits[1][0] - want_logits[0]).abs().max() > 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_state_bytes_counted(monkeypatch, name):
    """The cache's bytes = its blocks + (max_seqs + 1) slots of state_bytes (kv_cache's number: the
    linear-attention layers' conv and delta-rule rings); the preflight of `minfer serve -np N`
    counts them."""
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    eng = _engine(name)
    cfg = eng.model.cfg
    d = eng.model.dims
    n_rec = sum(eng.model.is_recurrent)
    assert state_bytes(cfg) == n_rec * (d.d_conv * d.conv_dim + 2 * d.n_v_heads * d.d_state * d.v_dim) * 4
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=CTX, max_seqs=3, n_blocks=40, block_size=4)
    per_block = PagedKVCache.bytes_per_block(cfg, 4)
    assert be.cache.nbytes() == 40 * per_block + 4 * state_bytes(cfg) == 40 * per_block + pool_state_bytes(cfg, 3)
    assert [g is not None for g in be.cache.states.layers] == list(eng.model.is_recurrent)

    gf = GGUFFile(DATA / f"{name}.gguf")
    per = preflight.kv_bytes_per_token(preflight.cache_config(gf), "cpu") * 16
    kv_pool = (3 * -(-CTX // 16) + 1) * per                     # -np 3 full contexts + the padding block
    monkeypatch.setattr(preflight, "available_bytes", lambda device: kv_pool + 4 * state_bytes(cfg))
    preflight.check_batch(gf, CTX, "cpu", 3, None, None)          # -np 3: 4 slots fit
    monkeypatch.setattr(preflight, "available_bytes", lambda device: kv_pool + 4 * state_bytes(cfg) - 1)
    with pytest.raises(MinferError, match="would need"):
        preflight.check_batch(gf, CTX, "cpu", 3, None, None)      # one byte short: the slots are counted
