"""The key/value cache of one sequence: preallocated for the whole context, written in place.

k, v: (n_layers, n_rows, n_kv_heads, head_dim). Position p of layer l lives at [l, p].

Per-layer geometry (opt-in): a config that carries `kv_layers` (gemma4's: models/gemma4.py
with_kv_layers, a ModelConfig with that one field more) gives each layer its own (kv heads, K head size, V head size),
or None for a layer that owns no cache (a shared-KV layer reads an earlier layer's). k and v are
then LayerViews: layer l's (n_rows, Hkv_l, Dk_l) / (n_rows, Hkv_l, Dv_l) views into one buffer
each, k[l] None for a layer without storage. k[l], k[l, a:b] and k[:, :rows] read as on the one
tensor, so the methods below are the same code for both. Every other architecture declares
nothing: one (n_layers, n_rows, Hkv, Dh) tensor each, as before.

Recurrent state (opt-in): a config that carries `state_layers` (granitehybrid's: per layer None, or
the shapes of the float32 tensors that layer keeps for the sequence, whatever its length) gets
them zeroed in `states`, read and written in place by the model through recurrent_state(layer);
they do not grow with the context (state_bytes: the memory preflight adds them once).

The cache protocol (docs/interfaces.md, "Cache protocol") is what a model sees of any cache:
    cache.write(layer, k, v, step)         # store the step's rotated keys/values (T, Hkv, Dh)
    cache.attend(layer, q, step, ctx)      # causal attention of q (T, H, Dh) -> (T, H, Dh)
    cache.write_rotated / attend_rotated   # optional: rope + write (+ attend) in fewer launches
    cache.write_window(layer, x, step, n)  # a short-convolution layer (lfm2): store the step's rows
                                           # x (T, W) as its K rows, get each token's last n rows
    cache.recurrent_state(layer)           # a recurrent layer (granitehybrid's Mamba-2): the tuple
                                           # of float32 tensors it keeps per sequence (opt-in, below)
    cache.n_ctx                            # rows: the largest position + 1 it can hold
    cache.context                          # positions a sequence may use (the engine's --ctx);
                                           # n_ctx may exceed it (CUDA rows rounded to 128).
                                           # What depends on the context (phi3's LongRoPE
                                           # factors) reads this, never the row count.
A paged, many-sequence cache implements the same two calls over its block tables, with a
Step that says which sequence each row belongs to.
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.errors import MinferError


def cache_rows(n_ctx: int, device) -> int:
    """Rows for a context of n_ctx positions. On CUDA, up to the next multiple of
    ops.LENGTH_BUCKET: prefill attention rounds its length up to it and reads the cache's rows
    up to that length, and prompts of up to Switches.prefill_graph_max tokens are graphed at
    lengths rounded to it. The context (what fits) stays n_ctx."""
    if torch.device(device).type != "cuda":
        return n_ctx
    b = ops.LENGTH_BUCKET
    return -(-n_ctx // b) * b


def window_rows(rows: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """rows (R, W); index, valid (T, n): rows[index] (T, n, W), zeros where not valid (a position
    before 0). Device tensors only: no host value (a CUDA-graph decode step may run it)."""
    T, n = index.shape
    got = rows.index_select(0, index.reshape(-1)).view(T, n, rows.shape[-1])
    return got * valid.unsqueeze(-1).to(got.dtype)


def window_index(positions: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions p - n + 1 .. p of each token clamped at 0, which of them are >= 0): (T, n) each."""
    p = positions.view(-1, 1) + torch.arange(1 - n, 1, device=positions.device).view(1, n)
    return p.clamp(min=0), p >= 0


def kv_layers(cfg) -> tuple | None:
    """The config's per-layer geometry (its `kv_layers`: per layer (Hkv, Dk, Dv) or None for no
    storage), or None: one geometry for every layer (the default)."""
    return getattr(cfg, "kv_layers", None) or None


def kv_bytes_per_position(cfg, elem: int) -> int:
    """Bytes one position takes over all layers: what KVCache.for_config allocates per row and
    PagedKVCache per slot (the memory preflight's number, commands/preflight.py)."""
    layers = kv_layers(cfg)
    v_in_k = getattr(cfg, "cache_v_in_k", 0)
    if layers is None:
        return (1 if v_in_k else 2) * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem
    return sum(h * (dk + (0 if v_in_k else dv)) for h, dk, dv in (g for g in layers if g is not None)) * elem


def layer_views(rows: int, layers: tuple, v_in_k: int, device, dtype, who: str) -> tuple:
    """(k, v) LayerViews of per-layer geometry `layers` (kv_layers) with `rows` rows a layer. v_in_k > 0:
    every layer with a cache keeps V as the first v_in_k dims of its K rows (its entry's Dv; kimi-linear's
    MLA layers, (1, R + Dr, R)): v's views are views of k's, stored once."""
    k = LayerViews.zeros(rows, [g and (g[0], g[1]) for g in layers], device, dtype)
    if not v_in_k:
        return k, LayerViews.zeros(rows, [g and (g[0], g[2]) for g in layers], device, dtype)
    for i, g in enumerate(layers):
        if g is not None and not (g[2] == v_in_k and 0 < v_in_k < g[1]):
            raise MinferError(f"{who}: layer {i}'s geometry {tuple(g)} with V in K: V must be the first "
                              f"{v_in_k} dims of its K rows (Dv == {v_in_k} < Dk)")
    return k, LayerViews([None if kl is None else kl[..., :v_in_k] for kl in k.views])


def views_share_k(k, v) -> bool:
    """Whether v is a view of k's first dims (V in K): one tensor each, or per layer (LayerViews: every
    layer whose V has elements; a LayerViews row slice has no buffer, so the buffers cannot say it)."""
    if isinstance(k, LayerViews):
        pairs = [(a, b) for a, b in zip(k.views, v.views) if a is not None and b is not None and b.numel()]
        return bool(pairs) and all(a.data_ptr() == b.data_ptr() for a, b in pairs)
    return v.data_ptr() == k.data_ptr()


def state_layers(cfg) -> tuple | None:
    """The config's recurrent state (its `state_layers`: per layer None or a tuple of tensor
    shapes), or None: no layer keeps state (the default)."""
    return getattr(cfg, "state_layers", None) or None


def state_bytes(cfg) -> int:
    """Bytes of one sequence's recurrent state over all layers (float32, whatever the context):
    what KVCache.for_config allocates next to its rows (0 without state_layers)."""
    return 4 * sum(math.prod(s) for g in (state_layers(cfg) or ()) if g is not None for s in g)


class LayerViews:
    """Per-layer tensors of one cache side: [l] -> layer l's (rows, Hkv_l, D_l) view (None: no
    storage); [l, ...] indexes into it; [:, :rows] -> the first rows of every layer (LayerViews)."""

    def __init__(self, views: list, buffer: torch.Tensor | None = None):
        self.views, self.buffer = views, buffer
        # (no layer with storage, an attention-free model's: the buffer's, or none for a view of it)
        first = next((v for v in views if v is not None), buffer)
        self.device, self.dtype = (None, None) if first is None else (first.device, first.dtype)

    @classmethod
    def zeros(cls, rows: int, shapes, device, dtype) -> "LayerViews":
        """One zeroed buffer holding each layer's (rows, h, d) in turn; shapes[l] None: no storage."""
        sizes = [0 if s is None else rows * s[0] * s[1] for s in shapes]
        buf = torch.zeros(sum(sizes), device=device, dtype=dtype)
        views, off = [], 0
        for s, n in zip(shapes, sizes):
            views.append(None if s is None else buf[off:off + n].view(rows, s[0], s[1]))
            off += n
        return cls(views, buf)

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if key[0] == slice(None):
                return LayerViews([None if v is None else v[key[1:]] for v in self.views])
            return self.views[key[0]][key[1:]]
        return self.views[key]

    def __setitem__(self, key, value) -> None:
        if not isinstance(key, tuple):
            key = (key,)
        self.views[key[0]][key[1:]] = value

    def copy_(self, other: "LayerViews") -> "LayerViews":
        for a, b in zip(self.views, other.views):
            if a is not None:
                a.copy_(b)
        return self

    def numel(self) -> int:
        return sum(v.numel() for v in self.views if v is not None)

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def data_ptr(self) -> int:
        return self.buffer.data_ptr() if self.buffer is not None else 0


class KVCache:
    """v_in_k > 0 (deepseek2's MLA latent, ModelConfig.cache_v_in_k): V is no tensor of its own but
    the view k[..., :v_in_k] -- each position's V row is the first v_in_k dims of its K row, stored
    once, as llama.cpp's MLA cache does (a K-only cache, V a view of it: src/models/deepseek2.cpp);
    write() then stores K only (v must be those dims of k). attend() gives (T, H, v_in_k).
    layers (per-layer geometry, kv_layers): k, v are LayerViews of each layer's own size; with v_in_k
    too, v's are views of k's (layer_views: kimi-linear's MLA layers)."""

    def __init__(self, n_layers: int, n_ctx: int, n_kv_heads: int, head_dim: int,
                 device="cpu", dtype=torch.float32, context: int | None = None, v_in_k: int = 0,
                 layers: tuple | None = None, states: tuple | None = None):
        self.n_ctx = n_ctx
        self.context = context or n_ctx
        self.states = None if states is None else [
            None if g is None else tuple(torch.zeros(s, device=device, dtype=torch.float32) for s in g) for g in states]
        if layers is not None:
            if len(layers) != n_layers:
                raise MinferError(f"KVCache: per-layer geometry of {len(layers)} layers for {n_layers}")
            self.k, self.v = layer_views(n_ctx, layers, v_in_k, device, dtype, "KVCache")
            return
        self.k = torch.zeros(n_layers, n_ctx, n_kv_heads, head_dim, device=device, dtype=dtype)
        if v_in_k:
            if not 0 < v_in_k <= head_dim:
                raise MinferError(f"KVCache: V as the first {v_in_k} dims of K rows of {head_dim}")
            self.v = self.k[..., :v_in_k]
        else:
            self.v = torch.zeros(n_layers, n_ctx, n_kv_heads, head_dim, device=device, dtype=dtype)

    @classmethod
    def for_config(cls, cfg, n_ctx: int, device="cpu", dtype=torch.float32,
                   context: int | None = None) -> "KVCache":
        """n_ctx rows (cache_rows); context: the positions a sequence may use, default n_ctx."""
        return cls(cfg.n_layers, n_ctx, cfg.n_kv_heads, cfg.head_dim, device, dtype, context,
                   v_in_k=getattr(cfg, "cache_v_in_k", 0), layers=kv_layers(cfg), states=state_layers(cfg))

    def rows_view(self, rows: int) -> "KVCache":
        """The same cache seen as its first `rows` rows: k and v are views (writes land in this
        cache), n_ctx is `rows`, the context stays this one's (phi3's rope factors read it). A
        CUDA graph captured over a short view sizes its decode attention for `rows` keys (one
        key split, no merge launch: runtime/cuda_graphs.py); it serves positions below `rows`."""
        if not 0 < rows <= self.n_ctx:
            raise MinferError(f"rows_view({rows}): the cache has {self.n_ctx} rows")
        view = object.__new__(type(self))
        view.n_ctx, view.context = rows, self.context
        view.k, view.v = self.k[:, :rows], self.v[:, :rows]
        view.states = self.states          # the same tensors (not per row)
        return view

    def v_is_view(self) -> bool:
        """V is the view of K's first dims (v_in_k): stored, and written, once."""
        return views_share_k(self.k, self.v)

    def nbytes(self) -> int:
        k = self.k.numel() * self.k.element_size()
        s = sum(t.numel() * 4 for g in (self.states or ()) if g is not None for t in g)
        return s + (k if self.v_is_view() else k + self.v.numel() * self.v.element_size())

    def _check_room(self, step, T: int) -> None:
        """A step with a host start writing T rows must fit the cache (inside a graph: the caller's check)."""
        if step.start is not None and step.start + T > self.n_ctx:
            raise MinferError(f"the KV cache holds {self.n_ctx} positions; writing {T} "
                              f"token{'s' if T != 1 else ''} at position {step.start} would overflow it (raise --ctx)")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, step) -> None:
        """Store k, v (T, Hkv, Dh) at the step's positions.

        With a host start: rows [start, start + T), bounds checked. Without one (a CUDA-graph
        decode step), index_copy_ at step.positions, with no host value involved (the caller
        checked the bound before the replay)."""
        v_apart = not self.v_is_view()      # V a view of K (v_in_k): written with K
        if step.start is None:
            self.k[layer].index_copy_(0, step.positions, k.to(self.k.dtype))
            if v_apart:
                self.v[layer].index_copy_(0, step.positions, v.to(self.v.dtype))
            return
        T = k.shape[0]
        self._check_room(step, T)
        self.k[layer, step.start:step.start + T] = k
        if v_apart:
            self.v[layer, step.start:step.start + T] = v

    def write_rotated(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step, rope,
                      ctx=None) -> torch.Tensor:
        """rope(q) returned; rope(k) and v stored at the step's positions (the optional cache
        protocol method attention_branch prefers to rope + rope + write). On CUDA one kernel
        (ops.rope_kv_write, Switches.fused_rope_kv) when every head dim rotates and the dtypes
        agree; otherwise, and on the CPU, the three calls."""
        T = q.shape[0]
        self._check_room(step, T)
        if self.k.device.type == "cuda":
            out = ops.rope_kv_write(q, k, v, step.positions, rope, self.k[layer], self.v[layer], ctx)
            if out is not None:
                return out
        q = ops.rope(q, step.positions, rope)
        self.write(layer, ops.rope(k, step.positions, rope), v, step)
        return q

    def project_rotated(self, layer: int, h: torch.Tensor, weights, biases, step, rope, ctx=None):
        """rope(q) (1, Hq * Dh) for one decode row h (1, D) through the layer's q/k/v weights, with
        rope(k) and v stored at the step's position, by the q/k/v GEMV itself (the optional cache
        protocol method layers.attention_heads prefers; CUDA: ops.linear_qkv_rope, Switches.qkv_rope);
        None where that does not apply (the CPU, T > 1, the launch's conditions): the caller
        multiplies, then rotates and writes."""
        if h.shape[0] != 1 or self.k.device.type != "cuda":
            return None
        self._check_room(step, 1)
        return ops.linear_qkv_rope(h, weights, biases, step.positions, rope, self.k[layer], self.v[layer], ctx)

    def attend_rotated(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step, rope,
                       ctx=None, window: int = 0, softcap: float = 0.0) -> torch.Tensor | None:
        """write_rotated + attend for one token in the attention's own launches (the optional
        cache protocol method layers.rope_write_attend prefers; CUDA: ops.rope_attention, which
        rotates q and k, stores k and v at the step's position and attends); None where that
        does not apply (the CPU tensors of the reference, T > 1, the kernel's conditions): the
        caller does the two calls."""
        if q.shape[0] != 1:
            return None
        self._check_room(step, 1)
        return ops.rope_attention(q, k, v, step.positions, rope, self.k[layer], self.v[layer], ctx, window=window,
                                  softcap=softcap)

    def write_window(self, layer: int, x: torch.Tensor, step, n: int) -> torch.Tensor:
        """A short-convolution layer (lfm2, whose kv_layers entry is (1, W, 0): K rows of W, no V):
        store x (T, W) as the K rows of the step's positions and return each token's last n rows,
        positions p - n + 1 .. p, (T, n, W) in the cache's dtype, zeros before position 0. The
        rows of earlier steps are what the cache holds, so pieces, decode and reused prefixes
        read the same rows the whole sequence would."""
        T, W = x.shape
        kl = self.k[layer]                                   # (rows, 1, W)
        if step.start is None:
            kl.index_copy_(0, step.positions, x.view(T, 1, W).to(kl.dtype))
        else:
            self._check_room(step, T)
            kl[step.start:step.start + T] = x.view(T, 1, W)
        return window_rows(kl.view(-1, W), *window_index(step.positions, n))

    def recurrent_state(self, layer: int) -> tuple:
        """A recurrent layer's state tensors (float32, the shapes its state_layers entry gave),
        which the model reads and updates in place (models/mamba2.py: a conv ring and an SSM
        state ring, indexed by position so that a step at the same position can run again, as
        a CUDA graph's warm-up does)."""
        if self.states is None or self.states[layer] is None:
            raise MinferError(f"KVCache: layer {layer} keeps no recurrent state (the config has no state_layers entry)")
        return self.states[layer]

    def attend(self, layer: int, q: torch.Tensor, step, ctx=None, window: int = 0,
               softcap: float = 0.0, sinks=None, scale: float | None = None, alibi=None) -> torch.Tensor:
        """Causal attention of q (T, H, Dh) at the step's positions over this layer's cached
        positions [0, last + 1) -> (T, H, Dv) (Dv = Dh unless v_in_k); window > 0: only keys
        p - window < j <= p; softcap > 0: soft-capped scores (gemma2); sinks (H,): gpt-oss's sink
        logits; scale: the scores' factor, default 1/sqrt(Dh) (deepseek2 passes its own: ops.attention);
        alibi (H,): ALiBi slopes (bloom, mpt; the paged cache has none: those models' paged_kv is False)."""
        kw = {} if alibi is None else {"alibi": alibi}
        return ops.attention(q, self.k[layer], self.v[layer], step.attn_start, ctx, window=window,
                             softcap=softcap, sinks=sinks, scale=scale, **kw)
