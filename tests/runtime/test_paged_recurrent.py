"""The Mamba-2 hybrids (granitehybrid, nemotron_h, falcon-h1) in the batch engine: per-sequence state
slots beside the paged cache (runtime/paged_state.py, models/mamba2.py conv_scan_batch).

Batched greedy of three prompts of different lengths, split into chunks by a small token budget
(decode rows of some sequences next to prefill chunks of others in one step), equals each prompt's
single-sequence greedy, logits within float32 rounding; also with held (asynchronous) steps and under
preemption. A slot a finished sequence gave back starts clean (and does not when the zeroing is
skipped); a shared prefix's blocks would give wrong output (so the prefix cache is off for these
models); the state slots are counted in the cache's bytes, the CUDA sizing and the preflight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models.test_arch_vs_transformers import engine, ref

from minfer.errors import MinferError
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.kv_cache import state_bytes
from minfer.runtime.paged_kv import PagedKVCache
from minfer.runtime.paged_state import PagedStatePool, plan_state_slots, pool_state_bytes
from minfer.runtime.sampling import SamplingParams

NAMES = ["granitehybrid", "granitehybrid-dense", "nemotron_h", "falcon-h1", "mamba2", "mamba", "falcon-mamba", "jamba", "nemotron_h_moe",
         "nemotron_h_moe-latent"]
GREEDY = SamplingParams(temperature=0)
N_NEW = 8
CTX = 96
_engines: dict = {}


def _engine(name):
    if name not in _engines:
        _engines[name] = engine(name, ctx=CTX)
    return _engines[name]


def _prompts(name):
    ids = ref(name)["ids"].tolist()
    return [ids[:23], ids[5:12], ids[2:40]]      # 23, 7 and 38 tokens


def _single(eng, prompt, n=N_NEW):
    """Single-sequence greedy: tokens and each sampled row's logits (the single engine's cache)."""
    eng.reset()
    toks, logits = [], []
    row = eng.prefill(list(prompt))
    for i in range(n):
        tok = int(torch.argmax(row))
        logits.append(row.float())
        toks.append(tok)
        if i + 1 < n:
            row = eng.forward([tok], len(prompt) + i)[-1]
    return toks, logits


def _batch(eng, prompts, max_seqs=3, n_blocks=40, budget=10, n=N_NEW, buckets=None, **kw):
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=CTX, max_seqs=max_seqs, n_blocks=n_blocks, block_size=4,
                     token_budget=budget, **kw)
    be.keep_logits = True
    if buckets is not None:
        from minfer.runtime.batch_graphs import BatchDecodeGraphs

        be.graphs = BatchDecodeGraphs(be, buckets)
    seqs = [be.add(p, GREEDY, n, ignore_eos=True) for p in prompts]
    while be.has_work:
        be.step()
    return be, [[t for t in s.tokens[s.n_prompt:]] for s in seqs], [s.state.logits for s in seqs]


@pytest.mark.parametrize("name", NAMES)
def test_batched_greedy_equals_single(name):
    eng = _engine(name)
    prompts = _prompts(name)
    be, toks, logits = _batch(eng, prompts)
    assert be.stats["steps"] > 8                                # chunked: 68 prompt tokens, budget 10
    assert be.stats["decode_rows"] > 0 and be.stats["prefill_tokens"] == sum(map(len, prompts))
    assert be.cache.states is not None and be.blocks.prefix_cache is False
    for p, t, lg in zip(prompts, toks, logits):
        st, sl = _single(eng, p)
        assert t == st
        for a, b in zip(lg, sl):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert be.cache.states.n_free == 3                          # every slot back


def test_held_steps_and_preemption():
    """granitehybrid with held steps (chained decode rows launched from device tokens, the server's
    CUDA logic on the CPU), then with a pool too small for all three (preemption recomputes from 0
    into a fresh slot): the same tokens."""
    eng = _engine("granitehybrid")
    prompts = _prompts("granitehybrid")
    single = [_single(eng, p, 12)[0] for p in prompts]
    be, toks, _ = _batch(eng, prompts, n=12, async_steps=True)
    assert be.stats["chained_steps"] > 0 and toks == single
    be, toks, _ = _batch(eng, prompts, n=12, n_blocks=20)
    assert be.scheduler.n_preemptions > 0 and toks == single


def test_decode_buckets_with_padding_rows(monkeypatch):
    """The CUDA graph path's inputs on the CPU: decode-only steps through batch_graphs' static bucket
    tensors (3 rows padded to 4, the padding row in state slot 0 at position 0), the graph's replay
    standing in for an eager forward over those tensors: the same tokens as single greedy."""
    from minfer.runtime.batch_graphs import BatchDecodeGraphs

    class Eager:
        def __init__(self, graphs, b):
            self.graphs, self.b = graphs, b

        def replay(self):
            self.b.logits = self.graphs._forward(self.b)

    monkeypatch.setattr(BatchDecodeGraphs, "_capture", lambda self, b: setattr(b, "graph", Eager(self, b)))
    eng = _engine("falcon-h1")
    prompts = _prompts("falcon-h1")
    be, toks, _ = _batch(eng, prompts, buckets=[1, 2, 4])
    assert be.stats["graph_steps"] > 0
    assert be.graphs._by_size[4].step.state_slots is not None
    assert toks == [_single(eng, p)[0] for p in prompts]


def test_reused_slot_starts_clean(monkeypatch):
    """One slot (max_seqs 1): the second prompt takes the slot the first gave back. Zeroed, it equals
    its single greedy; with the zeroing skipped it reads the first sequence's state and differs."""
    eng = _engine("nemotron_h")
    a, b = _prompts("nemotron_h")[2], _prompts("nemotron_h")[0]
    want, want_logits = _single(eng, b)
    _, toks, logits = _batch(eng, [a, b], max_seqs=1)
    assert toks[1] == want
    torch.testing.assert_close(logits[1][0], want_logits[0], rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(PagedStatePool, "zero", lambda self, slot: None)
    _, toks, logits = _batch(eng, [a, b], max_seqs=1)
    assert (logits[1][0] - want_logits[0]).abs().max() > 1e-2


def test_shared_prefix_would_be_wrong():
    """The batch engine turns the prefix cache off for a recurrent model (asked for or not): a second
    prompt that begins with the first's tokens computes them again. Forced on, the second attaches
    the cached blocks, starts its chunk past them from a fresh (zero) state and its logits miss."""
    eng = _engine("granitehybrid")
    ids = ref("granitehybrid")["ids"].tolist()
    a, b = ids[:30], ids[:20] + ids[30:36]
    want, want_logits = _single(eng, b)

    def run(force):
        be = BatchEngine(eng.model, eng.tokenizer, n_ctx=CTX, max_seqs=2, n_blocks=40, block_size=4,
                         prefix_cache=True)
        be.keep_logits = True
        if force:
            be.blocks.prefix_cache = True
        be.generate_many([a], GREEDY, 2)
        s = be.add(b, GREEDY, N_NEW, ignore_eos=True)
        while be.has_work:
            be.step()
        return be, s

    be, s = run(False)
    assert be.blocks.prefix_cache is False and be.blocks.hits == 0
    assert s.tokens[s.n_prompt:] == want
    be, s = run(True)
    assert be.blocks.hits == 20                                  # 5 blocks of 4 shared
    assert (s.state.logits[0] - want_logits[0]).abs().max() > 1e-2

    from minfer.runtime.batch_engine import BatchEngine as BE

    other = engine("llama3")                                     # other archs: unchanged
    assert BE(other.model, other.tokenizer, n_ctx=64, max_seqs=2, n_blocks=20, block_size=4).blocks.prefix_cache
    assert BE(other.model, other.tokenizer, n_ctx=64, max_seqs=2, n_blocks=20, block_size=4).cache.states is None


def test_state_bytes_counted(monkeypatch):
    """The cache's bytes = its blocks + (max_seqs + 1) slots of state_bytes (kv_cache's number, the
    preflight's); the CUDA sizing takes the slots' states from the free memory first; the preflight
    of `minfer serve -np N` counts them."""
    eng = _engine("falcon-h1")
    cfg = eng.model.cfg
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=CTX, max_seqs=3, n_blocks=40, block_size=4)
    per_block = PagedKVCache.bytes_per_block(cfg, 4)
    assert state_bytes(cfg) > 0
    assert be.cache.nbytes() == 40 * per_block + 4 * state_bytes(cfg) == 40 * per_block + pool_state_bytes(cfg, 3)

    sb = 1000
    assert plan_state_slots(10**6, sb, 7, 256) == (7, 10**6 - 8 * sb)
    assert plan_state_slots(10**6, sb, None, 256) == (256, 10**6 - 257 * sb)
    assert plan_state_slots(10**5, sb, None, 256) == (49, 10**5 - 50 * sb)   # half of the memory at most

    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(Path(__file__).resolve().parents[1] / "data" / "arch" / "falcon-h1.gguf")
    per = preflight.kv_bytes_per_token(preflight.cache_config(gf), "cpu") * 16
    kv_pool = (4 * -(-CTX // 16) + 1) * per
    monkeypatch.setattr(preflight, "available_bytes", lambda device: kv_pool + 4 * state_bytes(cfg))
    preflight.check_batch(gf, CTX, "cpu", 3, None, None)          # -np 3: 4 slots fit
    monkeypatch.setattr(preflight, "available_bytes", lambda device: kv_pool + 4 * state_bytes(cfg))
    with pytest.raises(MinferError, match="would need"):
        preflight.check_batch(gf, CTX, "cpu", 4, None, None)      # -np 4: 4 contexts + 5 slots do not
