"""phi3's LongRoPE factor choice follows the context (the engine's --ctx), not the KV cache's rows.

On CUDA the cache has its rows rounded up to ops.LENGTH_BUCKET (runtime/kv_cache.py cache_rows:
32 positions -> 128 rows). phi3 read the row count, so on the H200 a 32-position context past
nothing took rope_factors_long while the CPU took the short ones: row 0 of the logits matched
(rope is the identity at position 0), every later row was off by a relative 1.2-1.5 against
transformers (tests/gpu/test_arch_gpu.py). These tests give the CPU engine the CUDA row count and
compare with transformers' logits (tests/data/arch/*.npz, tools/gen_arch_fixtures.py); they fail
without the fix with the same 1.48 / 1.19 errors the GPU run showed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest, over positions, of max |got - ref| / max |ref| at that position."""
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def cuda_rows(n_ctx: int, device) -> int:
    """The CUDA rounding of cache_rows, on any device (ops.LENGTH_BUCKET rows)."""
    from minfer import ops

    return -(-n_ctx // ops.LENGTH_BUCKET) * ops.LENGTH_BUCKET


def engine(name: str, ctx: int, monkeypatch):
    import os

    from minfer.runtime import engine as engine_mod
    from minfer.runtime import kv_cache
    from minfer.switches import Switches

    monkeypatch.setattr(kv_cache, "cache_rows", cuda_rows)   # (read at the load: runtime/embed.py engine_cache)
    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})   # the float32 reference
    eng = engine_mod.Engine.load(DATA / f"{name}.gguf", ctx=ctx, progress=False, switches=sw)
    assert eng.cache.n_ctx == 128 and eng.cache.context == ctx
    return eng


@pytest.mark.parametrize("name", ["phi3", "phi3partial"])
def test_phi3_rope_factors_follow_the_context_not_the_cache_rows(name, monkeypatch):
    r = np.load(DATA / f"{name}.npz")
    eng = engine(name, 32, monkeypatch)            # context 32 == original_context_length: short
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) < 1e-3
    eng = engine(name, 64, monkeypatch)            # past it: long (transformers at 48 tokens)
    assert rel_err(eng.logits(r["ids_long"].tolist()).numpy(), r["logits_long"]) < 1e-3


def test_phi3_rope_choice_reads_cache_context():
    """The model-level rule: rows beyond the context change nothing; a cache without a context
    is refused by name rather than guessed."""
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.runtime.kv_cache import KVCache

    r = np.load(DATA / "phi3.npz")
    m = load_model(GGUFFile(DATA / "phi3.gguf"), progress=False)
    ids = torch.tensor(r["ids"])
    got = m.forward(ids, Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 128, context=32)).numpy()
    assert rel_err(got, r["logits"]) < 1e-3
    assert m.rope_for(KVCache.for_config(m.cfg, 128, context=33)) is m.cfg.rope_long

    class NoContext:
        pass

    with pytest.raises(MinferError, match="NoContext has no `context`"):
        m.rope_for(NoContext())


def test_phi3_batch_engine_context(monkeypatch):
    """The paged cache carries the batch engine's context too (it had none: phi3 with LongRoPE
    factors failed there with an AttributeError); its greedy tokens are the single engine's."""
    import os

    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams
    from minfer.switches import Switches

    r = np.load(DATA / "phi3.npz")
    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    eng = Engine.load(DATA / "phi3.gguf", ctx=32, progress=False, switches=sw)
    be = BatchEngine.from_engine(eng, max_seqs=2)
    assert be.cache.context == 32
    prompt, n = r["prompt"].tolist(), len(r["greedy"])
    (events,) = be.generate_many([prompt], SamplingParams(temperature=0), max_new_tokens=n)
    assert [ev.token_id for ev in events] == r["greedy"].tolist()
