"""The padded prefill (what a prefill CUDA graph captures) equals the plain prefill: padding
after the real tokens changes neither their last logits nor their cached keys/values."""

from __future__ import annotations

import torch



def test_padded_prefill_equals_plain(tmp_path):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.models import Step
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q8_0", seed=5, progress=False)
    a = Engine.load(str(path), device="cpu", ctx=160, progress=False)
    b = Engine.load(str(path), device="cpu", ctx=160, progress=False)
    g = torch.Generator().manual_seed(4)
    for t in (1, 37, 100):
        ids = torch.randint(0, p.vocab, (t,), generator=g)
        want = a.prefill(ids.tolist())                                # (V,)
        tb = 128
        padded = torch.zeros(tb, dtype=torch.long)
        padded[:t] = ids
        step = Step(torch.arange(tb), 0, torch.tensor([t - 1]))      # the prefill graph's step
        got = b.model.forward(padded, step, b.cache, b.ctx)[0]
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert torch.allclose(b.cache.k[:, :t], a.cache.k[:, :t], rtol=1e-4, atol=1e-5)
        assert torch.allclose(b.cache.v[:, :t], a.cache.v[:, :t], rtol=1e-4, atol=1e-5)
        # a decode step after the padded prefill sees only the real tokens
        b.tokens = ids.tolist()
        nxt = int(want.argmax())
        assert torch.allclose(b.forward([nxt], t)[-1], a.forward([nxt], t)[-1], rtol=1e-4, atol=1e-4)
