"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """(path, vocab) of a tiny synthetic qwen2 GGUF (Q4_K_M, seed 6): the device-draw tests' model."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path_factory.mktemp("tiny") / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=6, progress=False)
    return str(path), p.vocab
