"""The perplexity protocol (llama.cpp tools/perplexity/perplexity.cpp) on a tiny model, with the
expected numbers from the independent HF-style forward in tests/models/tiny.py."""

from __future__ import annotations

import io
import math

import pytest
import torch

from minfer.commands.perplexity import perplexity
from minfer.gguf_file import GGUFFile
from minfer.models import load_model
from minfer.runtime.engine import Engine
from models.tiny import TinySpec, hf_forward, hf_weights, write_tiny_model


@pytest.mark.parametrize("add_bos", [False, True])
def test_chunks_bos_second_half_and_error(tmp_path, add_bos):
    spec = TinySpec(arch="llama", seed=21, ctx=64)
    w = hf_weights(spec)
    eng = Engine(load_model(GGUFFile(write_tiny_model(tmp_path / "t.gguf", spec, w)), progress=False), None, 16)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(2, spec.vocab, (53,), generator=g).tolist()   # 3 full chunks of 16 + 5 left over
    BOS = 1
    nlls = []
    for c in range(3):
        chunk = tokens[c * 16:(c + 1) * 16]
        if add_bos:
            chunk = [BOS] + chunk[1:]
        lp = torch.log_softmax(hf_forward(w, spec, chunk), -1)      # (16, V) float64
        for j in range(8, 15):                                       # logits [n/2, n-1)
            nlls.append(-float(lp[j, chunk[j + 1]]))
    n = len(nlls)
    mean = sum(nlls) / n
    var = sum(x * x for x in nlls) / n - mean * mean
    want_ppl = math.exp(mean)
    want_err = math.sqrt(var / (n - 1)) * want_ppl
    out = io.StringIO()
    ppl, err, running = perplexity(eng, tokens, 16, 3, add_bos, BOS, out=out, progress=False)
    assert n == 21 and len(running) == 3
    assert ppl == pytest.approx(want_ppl, rel=1e-5)
    assert err == pytest.approx(want_err, rel=1e-4)
    assert running[0] == pytest.approx(math.exp(sum(nlls[:7]) / 7), rel=1e-5)
    assert out.getvalue().startswith(f"[1]{running[0]:.4f},[2]{running[1]:.4f},[3]")
