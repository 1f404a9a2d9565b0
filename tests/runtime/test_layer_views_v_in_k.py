"""Per-layer cache geometry (runtime/kv_cache.py kv_layers) with and without V in K.

- A per-layer cache's short view (rows_view, what the short decode graph captures on CUDA) writes V: its
  LayerViews row slices have no buffer, and v_is_view() compared the buffers' addresses (0 == 0), so it called
  V a view of K and write() skipped V (found while adding V in K for kimi-linear; no model on the CPU runs the
  short view, the CUDA graphs do).
- V in K with per-layer geometry (kv_cache.layer_views): each layer's V the first v_in_k dims of its K rows,
  written once, in the single-sequence and the paged cache; a layer whose Dv is not v_in_k is refused by name."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.runtime.kv_cache import KVCache, kv_bytes_per_position
from minfer.runtime.paged_kv import PagedKVCache

LAYERS = ((1, 8, 8), None, (2, 4, 4))


def test_short_view_of_a_per_layer_cache_writes_v():
    c = KVCache(3, 16, 2, 8, layers=LAYERS)
    assert not c.v_is_view()
    short = c.rows_view(8)
    assert not short.v_is_view()
    k, v = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    short.write(2, k, v, Step(torch.tensor([5]), None, "all"))     # a graph's step: no host start
    assert torch.equal(c.k[2][5], k[0]) and torch.equal(c.v[2][5], v[0])


def test_v_in_k_per_layer():
    layers = ((1, 12, 8), None, (1, 12, 8))
    c = KVCache(3, 16, 1, 12, v_in_k=8, layers=layers)
    assert c.v_is_view() and c.rows_view(4).v_is_view()
    k = torch.randn(2, 1, 12)
    c.write(2, k, k[..., :8], Step(torch.tensor([3, 4]), 3, "all"))
    assert torch.equal(c.v[2][3:5], k[..., :8]) and c.v[2].data_ptr() == c.k[2].data_ptr()
    q = torch.randn(1, 4, 12)
    out = c.attend(2, q, Step(torch.tensor([4]), 4, "all"))
    assert out.shape == (1, 4, 8)
    p = PagedKVCache(3, 4, 4, 1, 12, layers=layers, v_in_k=8)
    kp, vp = p.pages(2)
    assert p.v_is_view() and kp.shape == (4, 4, 1, 12) and vp.shape == (4, 4, 1, 8)
    assert vp.data_ptr() == kp.data_ptr()
    cfg = type("C", (), {"kv_layers": layers, "cache_v_in_k": 8, "n_layers": 3})()
    assert kv_bytes_per_position(cfg, 2) == 2 * (12 + 12)
    with pytest.raises(MinferError, match=r"layer 0's geometry \(1, 12, 6\)"):
        KVCache(3, 16, 1, 12, v_in_k=8, layers=((1, 12, 6), None, (1, 12, 8)))
    with pytest.raises(MinferError, match=r"layer 2's geometry \(1, 8, 8\)"):
        PagedKVCache(3, 4, 4, 1, 12, layers=((1, 12, 8), None, (1, 8, 8)), v_in_k=8)
