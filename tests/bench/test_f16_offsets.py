"""minfer.quants.f16_offsets (the f16 scales the kernel benchmarks make finite in random blocks)
against the gguf package's decoder: a NaN written at a declared offset makes the block decode to
NaN; random bytes elsewhere with finite scales at the offsets decode finite."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from minfer.quants import block_size, f16_offsets, type_size

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


def _blocks(qt, rng, n=64):
    raw = rng.integers(0, 256, size=(n, type_size(qt)), dtype=np.uint8)
    for off in f16_offsets(qt):
        raw[:, off:off + 2] = (rng.standard_normal((n, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_f16_offsets_are_the_scales(qt):
    rng = np.random.default_rng(int(qt))
    raw = _blocks(qt, rng)
    assert np.isfinite(gq.dequantize(raw, qt)).all()          # every scale was made finite
    assert len(f16_offsets(qt)) in (1, 2)
    for off in f16_offsets(qt):
        bad = raw.copy()
        bad[:, off:off + 2] = np.array([np.nan], dtype=np.float16).view(np.uint8)
        out = gq.dequantize(bad, qt).reshape(-1, block_size(qt))
        assert np.isnan(out).any(axis=1).all(), off             # every block reads that scale
