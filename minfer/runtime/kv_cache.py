"""The key/value cache: preallocated for the whole context, written in place.

k, v: (n_layers, n_ctx, n_kv_heads, head_dim). Position p of layer l lives at [l, p].
"""

from __future__ import annotations

import torch

from minfer.errors import MinferError


class KVCache:
    def __init__(self, n_layers: int, n_ctx: int, n_kv_heads: int, head_dim: int,
                 device="cpu", dtype=torch.float32):
        self.n_ctx = n_ctx
        self.k = torch.zeros(n_layers, n_ctx, n_kv_heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros(n_layers, n_ctx, n_kv_heads, head_dim, device=device, dtype=dtype)

    @classmethod
    def for_config(cls, cfg, n_ctx: int, device="cpu", dtype=torch.float32) -> "KVCache":
        return cls(cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim, device, dtype)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def update(self, layer: int, start_pos, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor | None = None):
        """Store k, v (T, Hkv, Dh) at positions [start_pos, start_pos + T); return the layer's
        whole caches (n_ctx, Hkv, Dh), of which [0, start_pos + T) are valid.

        start_pos may be a (1,) device tensor (decode under a CUDA graph): then the write goes
        through index_copy_ at `positions`, with no host value involved (the caller checked
        the bound before the replay)."""
        if isinstance(start_pos, torch.Tensor):
            self.k[layer].index_copy_(0, positions, k.to(self.k.dtype))
            self.v[layer].index_copy_(0, positions, v.to(self.v.dtype))
            return self.k[layer], self.v[layer]
        T = k.shape[0]
        if start_pos + T > self.n_ctx:
            raise MinferError(f"the KV cache holds {self.n_ctx} positions; writing {T} tokens at "
                              f"position {start_pos} would overflow it (raise --ctx)")
        self.k[layer, start_pos:start_pos + T] = k
        self.v[layer, start_pos:start_pos + T] = v
        return self.k[layer], self.v[layer]
