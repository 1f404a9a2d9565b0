"""Two engines of two different models in one process on the GPU: each gives the greedy output
it gives alone. Each owns its switches, workspace (scratch, prefetch sequence, biases), cache and
graphs; before the structure refactor the prefetch plan and scratch were process-wide."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.gpu


def _greedy(eng, prompt, n=24):
    from minfer.runtime.sampling import SamplingParams

    return [ev.token_id for ev in eng.generate(prompt, SamplingParams(temperature=0), max_new_tokens=n)]


@pytest.mark.parametrize("plen", [10, 40, 1100])   # GEMV prefill, graphed prefill, eager prefill with prefetch
def test_two_engines_match_alone(tmp_path, plen):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    pa, pb = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_synth(pa, get_preset("tiny").with_overrides(arch="qwen2"), "q4_k_m", seed=3, progress=False)
    write_synth(pb, get_preset("tiny").with_overrides(arch="llama", layers=3), "q8_0", seed=4, progress=False)
    g = torch.Generator().manual_seed(plen)
    prompt = torch.randint(0, 512, (plen,), generator=g).tolist()
    alone = {}
    for name, path in (("a", pa), ("b", pb)):
        eng = Engine.load(str(path), device="cuda", ctx=2048, progress=False)
        alone[name] = (_greedy(eng, prompt), _greedy(eng, prompt[: plen // 2 + 1]))
        del eng
        gc.collect()
        torch.cuda.empty_cache()
    assert alone["a"] != alone["b"]
    a = Engine.load(str(pa), device="cuda", ctx=2048, progress=False)
    b = Engine.load(str(pb), device="cuda", ctx=2048, progress=False)
    assert a.ctx.workspace is not b.ctx.workspace
    for prompt_i in (prompt, prompt[: plen // 2 + 1]):
        ga, gb = (e.generate(prompt_i, SamplingParams(temperature=0), max_new_tokens=24) for e in (a, b))
        got_a, got_b = [], []
        for ea, eb in zip(ga, gb):                  # one token of each engine, alternately
            got_a.append(ea.token_id)
            got_b.append(eb.token_id)
        i = 0 if prompt_i is prompt else 1
        assert got_a == alone["a"][i] and got_b == alone["b"][i]
