"""Gemma 4's per-layer KV cache (runtime/kv_cache.py kv_layers, minfer/models/gemma4.py): each layer
that owns a cache holds its own kv heads and head size, a shared-KV layer nothing. The bytes the
contiguous and the paged caches allocate per position equal sum over owning layers of
Hkv_l * (Dk_l + Dv_l) * elem, computed here from the file's metadata alone, equal the memory
preflight's number (commands/preflight.py), and are below what the padded form (every layer at the
largest head size and kv-head count) took. Uniform architectures keep their one tensor."""

from __future__ import annotations

import pytest
import torch

from models.test_arch_vs_transformers import DATA, engine

FIXTURES = ["gemma4", "gemma4-ple", "gemma4-moe"]


def expected_bytes_per_position(gf, elem: int) -> tuple[int, int]:
    """(per-layer, padded) bytes of one position, from the GGUF metadata: window layers of
    key_length_swa, global ones of key_length, head_count_kv per layer, the last shared_kv_layers
    layers owning nothing."""
    md = gf.metadata
    L = int(md["gemma4.block_count"])
    local = [bool(x) for x in md["gemma4.attention.sliding_window_pattern"][:L]]
    kv = md["gemma4.attention.head_count_kv"]
    kv = [int(x) for x in kv[:L]] if isinstance(kv, list) else [int(kv)] * L
    dh = [int(md["gemma4.attention.key_length_swa" if loc else "gemma4.attention.key_length"]) for loc in local]
    owning = L - int(md.get("gemma4.attention.shared_kv_layers", 0) or 0)
    per_layer = sum(kv[i] * (dh[i] + dh[i]) for i in range(owning)) * elem
    padded = L * max(kv) * 2 * max(dh) * elem
    return per_layer, padded


@pytest.mark.parametrize("name", FIXTURES)
def test_allocated_bytes_equal_the_per_layer_sum_and_the_preflight(name):
    from minfer.commands.preflight import cache_config, kv_bytes_per_token
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache
    from minfer.runtime.paged_kv import PagedKVCache

    gf = GGUFFile(DATA / f"{name}.gguf")
    per, padded = expected_bytes_per_position(gf, 4)
    eng = engine(name)
    m = eng.model
    assert eng.cache.nbytes() == eng.cache.n_ctx * per                         # what the engine allocated
    assert KVCache.for_config(m.cfg, 10).nbytes() == 10 * per
    assert kv_bytes_per_token(cache_config(gf), "cpu") == per                  # the preflight's number
    assert cache_config(gf).kv_layers == m.cfg.kv_layers
    paged = PagedKVCache.for_config(m.cfg, 7, 4)
    assert paged.nbytes() == 7 * 4 * per == 7 * PagedKVCache.bytes_per_block(m.cfg, 4)
    assert per < padded
    # each owning layer's own geometry; the shared ones hold nothing
    for i, g in enumerate(m.cfg.kv_layers):
        if m.kv_source[i] != i:
            assert g is None and eng.cache.k[i] is None and paged.k[i] is None
        else:
            assert g == (m.kv_heads[i], m.head_dims[i], m.head_dims[i])
            assert eng.cache.k[i].shape == (eng.cache.n_ctx, m.kv_heads[i], m.head_dims[i])
            assert paged.pages(i)[0].shape == (7, 4, m.kv_heads[i], m.head_dims[i])


def test_fixture_ratios():
    """The padded form's bytes over the per-layer ones on the fixtures: dense 6*2*2*32 / (4*2*32 + 2*1*64)
    = 768 / 384 (2x); E2B form (2 kv heads everywhere, 3 layers owning): 768 / (2*2*32 + 2*64) = 768 / 256 (3x)."""
    from minfer.gguf_file import GGUFFile

    got = {n: expected_bytes_per_position(GGUFFile(DATA / f"{n}.gguf"), 1) for n in ("gemma4", "gemma4-ple")}
    assert got == {"gemma4": (384, 768), "gemma4-ple": (256, 768)}


def published_ratio(L, window_of, kv_window, kv_global, dh_window, dh_global, shared):
    """(per-layer, padded) elements per position of a published Gemma 4 config."""
    owning = L - shared
    per = sum((kv_window * 2 * dh_window) if window_of(i) else (kv_global * 2 * dh_global) for i in range(owning))
    return per, L * max(kv_window, kv_global) * 2 * max(dh_window, dh_global)


def test_published_configs_arithmetic():
    """The real models' geometry (google/gemma-4-31B: 60 layers, 5 window : 1 global, 16 kv heads of 256
    on window layers, 4 of 512 on global ones; gemma-4-E2B: 35 layers, 4 window : 1 global, 1 kv head
    of 256 / 512, the last 20 layers sharing): the padded cache was 2.18x (31B) and 3.89x (E2B) this one."""
    per, padded = published_ratio(60, lambda i: (i + 1) % 6 != 0, 16, 4, 256, 512, 0)
    assert (per, padded) == (50 * 16 * 512 + 10 * 4 * 1024, 60 * 16 * 1024) == (450560, 983040)
    assert round(padded / per, 2) == 2.18
    per, padded = published_ratio(35, lambda i: (i + 1) % 5 != 0, 1, 1, 256, 512, 20)
    assert (per, padded) == (12 * 512 + 3 * 1024, 35 * 1024) == (9216, 35840)
    assert round(padded / per, 2) == 3.89


def test_uniform_models_keep_one_tensor():
    """Every other architecture declares no per-layer geometry: the same (L, rows, Hkv, Dh) tensors as before."""
    from minfer.commands.preflight import cache_config, kv_bytes_per_token
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache, kv_layers
    from minfer.runtime.paged_kv import PagedKVCache

    gf = GGUFFile(DATA / "gemma3.gguf")
    cfg = cache_config(gf)
    assert type(cfg) is ModelConfig and kv_layers(cfg) is None
    c = KVCache.for_config(cfg, 12)
    assert isinstance(c.k, torch.Tensor) and c.k.shape == (cfg.n_layers, 12, cfg.n_kv_heads, cfg.head_dim)
    assert c.nbytes() == 12 * kv_bytes_per_token(cfg, "cpu") == 2 * c.k.numel() * 4
    p = PagedKVCache.for_config(cfg, 5, 4)
    assert isinstance(p.k, torch.Tensor) and p.k.shape == (cfg.n_layers, 20, cfg.n_kv_heads, cfg.head_dim)
    assert p.nbytes() == 5 * PagedKVCache.bytes_per_block(cfg, 4) == 20 * kv_bytes_per_token(cfg, "cpu")


def test_layer_views_read_like_the_tensor():
    """k[l], k[l, a:b] (read and write), k[:, :rows], copy_ on the per-layer form."""
    from minfer.models.base import Step
    from minfer.runtime.kv_cache import KVCache

    c = KVCache(3, 8, 2, 8, layers=((2, 4, 4), None, (1, 8, 8)))
    assert c.nbytes() == 8 * (2 * 8 + 1 * 16) * 4 and not c.v_is_view()
    c.write(0, torch.ones(3, 2, 4), 2 * torch.ones(3, 2, 4), Step.at(2, 3, "cpu"))
    assert c.k[0, 2:5].eq(1).all() and c.k[0, :2].eq(0).all() and c.v[0][2:5].eq(2).all()
    view = c.rows_view(4)
    assert view.k[2].shape == (4, 1, 8) and view.k[1] is None
    view.write(2, torch.ones(1, 1, 8), torch.ones(1, 1, 8), Step(torch.tensor([3]), None))
    assert c.k[2][3].eq(1).all()
    d = KVCache(3, 8, 2, 8, layers=((2, 4, 4), None, (1, 8, 8)))
    d.k.copy_(c.k)
    assert torch.equal(d.k[0], c.k[0]) and torch.equal(d.k[2], c.k[2])
