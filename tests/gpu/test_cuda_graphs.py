"""The CUDA-graph decode step computes what the eager engine computes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch,recipe", [("qwen2", "q4_k_m"), ("llama", "q8_0")])
def test_graph_decode_matches_eager(tmp_path, arch, recipe):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.cuda_graphs import DecodeGraph
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch=arch)
    path = tmp_path / "m.gguf"
    write_synth(path, p, recipe, seed=2, progress=False)
    eager = Engine.load(str(path), device="cuda", ctx=128, progress=False)
    graphed = Engine.load(str(path), device="cuda", ctx=128, progress=False)
    prompt = torch.randint(0, p.vocab, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    le = eager.forward(prompt, 0)[-1]
    lg = graphed.forward(prompt, 0)[-1]
    g = DecodeGraph(graphed.model, graphed.cache)
    paths.reset()
    te, tg = int(le.argmax()), int(lg.argmax())
    for step in range(24):
        pos = len(prompt) + step
        le = eager.forward([te], pos)[-1]
        lg = g.step(tg, pos)[-1].cpu()
        assert tg == te
        rel = float((lg.double() - le.double()).norm() / le.double().norm())
        assert rel < 1e-4, (step, rel)
        te, tg = int(le.argmax()), int(lg.argmax())
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.capture"] == 1 and counts["graph.decode.replay"] == 24
