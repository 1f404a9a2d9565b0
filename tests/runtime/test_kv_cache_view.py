"""KVCache.rows_view: the first rows of a cache as a cache (the short decode graph's, see
runtime/cuda_graphs.py): its writes land in the whole cache, its attention sees only its rows,
and what depends on the sequence's context (phi3's rope factors) still reads the whole one."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.ops import reference
from minfer.runtime.kv_cache import KVCache


def test_rows_view_writes_into_the_cache_and_attends_its_rows():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(2, 40, 2, 16, context=37)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    view = cache.rows_view(16)
    assert (view.n_ctx, view.context) == (16, 37)
    assert view.k.shape == (2, 16, 2, 16) and view.k.data_ptr() == cache.k.data_ptr()
    k, v = torch.randn(1, 2, 16, generator=g), torch.randn(1, 2, 16, generator=g)
    # a graph's step: the position only in a device tensor
    view.write(1, k, v, Step(torch.tensor([9]), None))
    assert torch.equal(cache.k[1, 9], k[0]) and torch.equal(cache.v[1, 9], v[0])
    q = torch.randn(1, 4, 16, generator=g)
    got = view.attend(1, q, Step.at(9, 1, "cpu"))
    assert torch.equal(got, reference.attention(q, cache.k[1], cache.v[1], 9))
    # a host position past the view's rows is refused, as the whole cache refuses its own
    with pytest.raises(MinferError, match="holds 16 positions"):
        view.write(0, k, v, Step.at(16, 1, "cpu"))


@pytest.mark.parametrize("rows", [0, 41, -1])
def test_rows_view_out_of_range(rows):
    with pytest.raises(MinferError, match=r"rows_view\(.*the cache has 40 rows"):
        KVCache(1, 40, 1, 8).rows_view(rows)
