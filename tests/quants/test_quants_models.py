"""Dequantize real tensors of the catalog models, bit-exact vs gguf.quants (the reference).

Covers the layouts the shipped models actually use (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, F32)
as read by gguf's own GGUFReader, so a layout/offset mistake in real files would show.
"""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import minfer.quants as mq
from minfer.catalog import resolve_model


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_model_tensors_bit_exact(model):
    reader = gguf.GGUFReader(resolve_model(model))
    seen: dict[int, int] = {}
    for t in reader.tensors:
        qtype = int(t.tensor_type)
        # two tensors of each type, skipping the huge embeddings, keep the test quick
        if seen.get(qtype, 0) >= 2 or int(t.n_elements) > 8_000_000:
            continue
        seen[qtype] = seen.get(qtype, 0) + 1
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml ne0 is the last numpy dim
        got = mq.dequantize(np.asarray(t.data).view(np.uint8), qtype, shape, name=t.name)
        ref = np.asarray(gq.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        assert got.shape == shape
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), t.name
    assert len(seen) >= 2
