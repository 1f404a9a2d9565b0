"""The paged KV cache: one pool of fixed-size blocks per layer, read through block tables.

    k, v: (n_layers, n_blocks * block_size, Hkv, Dh)   slot = block * block_size + offset

A sequence's position p lives at slot `block_table[p // block_size] * block_size + p % block_size`
(block_manager.py hands out the blocks). One engine step feeds a ragged batch -- decode rows
(one token each) first, then prefill chunks -- described by a `PagedStep`: every token's
position and slot, the decode rows' block tables and lengths, and each chunk's span. The model
calls `cache.write(layer, k, v, step)` (the step's keys/values go to their slots), then
`cache.attend(layer, q, step, ctx)` (the Cache protocol of docs/interfaces.md):
- decode rows: paged attention straight through the block tables (CPU: `paged_attention_ref`;
  CUDA: the Triton kernel in minfer/ops/cuda/paged_attention.py, with sliding windows, chunks,
  softcap, sinks and the caller's scale);
- prefill chunks: the chunk's pages gathered into contiguous keys/values and the causal
  attention of minfer.ops over them (on CUDA: cuDNN/flash SDPA from position 0, the masked
  kernel after a cached prefix).
Block 0 is the padding block: padded decode rows (CUDA graph buckets) write there and attend
to its first slot only.

Per-layer geometry (a config with kv_layers, runtime/kv_cache.py: gemma4): k, v are LayerViews,
layer l's pool (n_blocks * block_size, Hkv_l, D_l), none for a layer that owns no cache; the same
block tables and slots serve every layer; with V in K too (kimi-linear's MLA layers), each layer's V
is the view of its K rows' first v_in_k dims (kv_cache.layer_views). Other architectures: the one
tensor above.

V in K (v_in_k > 0, ModelConfig.cache_v_in_k: deepseek2's MLA latent, one KV head of R + Dr dims,
V its first R): v is the view k[..., :R], stored and written once (KVCache's layout; the block
sizing and the preflight count K only: kv_bytes_per_position). Decode rows: on CUDA the paged MLA
kernel (ops/cuda/paged_attention_mla.py, attention.paged_decode.mla.triton: one key tile serves a
block of query heads, its latent part reused as V), on the CPU paged_attention_ref (V narrower
than K, attention.paged_decode.mla.torch); chunks: ops.attention over the gathered keys and their
first R dims as V (CUDA: attention.mla.torch, one-token chunks attention.mla.decode.triton).

Recurrent state (a config with state_layers: granitehybrid, nemotron_h, falcon-h1's Mamba-2 layers):
`states`, a pool of per-sequence state slots (runtime/paged_state.py); PagedStep carries each decode
row's slot (`state_slots`, on the device) and each chunk's (`chunk_state_slots`), and
`recurrent_state(layer)` gives the model the layer's pools with them (a BatchState).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.ops import paths
from minfer.errors import MinferError
from minfer.runtime.kv_cache import kv_bytes_per_position, kv_layers, layer_views, state_layers


@dataclass
class PagedStep:
    """One ragged batch. Decode rows are tokens [0, n_decode); chunk i is tokens
    [chunks[i][0], chunks[i][0] + chunks[i][1]) at positions from chunks[i][2]."""

    positions: torch.Tensor        # (T,) int64
    slots: torch.Tensor            # (T,) int64, where each token's K/V is written
    n_decode: int
    block_tables: torch.Tensor     # (n_decode, max_blocks) int32; padded with block 0
    context_lens: torch.Tensor     # (n_decode,) int32: keys each decode row attends (incl. itself)
    chunks: list                   # [(q_start, n, start_pos, slots_of_all_keys (start_pos + n,) int64)]
    logit_rows: torch.Tensor       # (R,) int64: rows whose logits are wanted, in item order
    # recurrent state slots (runtime/paged_state.py; 0 for a sequence without one, the padding slot)
    state_slots: torch.Tensor | None = None   # (n_decode,) int64: each decode row's sequence's slot
    chunk_state_slots: tuple = ()             # each chunk's sequence's slot

    @classmethod
    def build(cls, items, block_size: int, device, pad_decode_to: int | None = None,
              max_blocks: int | None = None, key_round: int | None = None, states: bool = False) -> "PagedStep":
        """items: scheduler StepItems (decode rows first). pad_decode_to: a batch bucket (a
        decode-only step under a CUDA graph): extra rows write to and read block 0.
        key_round (default 128 on CUDA, 1 on the CPU): a chunk's gathered keys are padded (with
        slot 0) to a multiple of it, so the prefill attention sees few distinct lengths (cuDNN
        builds a plan per length; minfer/ops/cuda/attention.py); causal masking keeps the
        padding keys, which come after every real one, out of every real row. states: the
        cache keeps recurrent state slots (the decode rows' state_slots tensor is made)."""
        if key_round is None:
            key_round = 128 if torch.device(device).type == "cuda" else 1
        bs = block_size
        positions, slots, logit_rows = [], [], []
        tables, lens, chunks = [], [], []
        row_slots, chunk_slots = [], []
        n_decode = 0
        t = 0
        for it in items:
            table = it.seq.block_table
            pos = list(range(it.start, it.start + it.n))
            positions += pos
            slots += [table[p // bs] * bs + p % bs for p in pos]
            if it.is_decode and not chunks:
                n_decode += 1
                tables.append(table)
                lens.append(it.start + 1)
                row_slots.append(getattr(it.seq, "state_slot", 0))
            else:
                n_keys = it.start + it.n
                key_slots = [table[p // bs] * bs + p % bs for p in range(n_keys)]
                key_slots += [0] * (-n_keys % key_round)
                chunks.append((t, it.n, it.start, key_slots))
                chunk_slots.append(getattr(it.seq, "state_slot", 0))
            t += it.n
            if it.sample:
                logit_rows.append(t - 1)
        if pad_decode_to is not None:
            if chunks or pad_decode_to < n_decode:
                raise MinferError("a padded step holds decode rows only, at most the bucket size")
            extra = pad_decode_to - n_decode
            positions += [0] * extra
            slots += [0] * extra
            tables += [[0]] * extra
            lens += [1] * extra
            row_slots += [0] * extra
            logit_rows += list(range(n_decode, pad_decode_to))
            n_decode = pad_decode_to
        width = max_blocks or max((len(tb) for tb in tables), default=1)
        # one tensor from padded rows (a torch.tensor per row cost ~1 ms per 100 rows)
        bt = torch.tensor([tb + [0] * (width - len(tb)) for tb in tables] if tables else [[0] * width],
                          dtype=torch.int32)[:n_decode]
        lt = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return cls(positions=lt(positions), slots=lt(slots), n_decode=n_decode,
                   block_tables=bt.to(device), context_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                   chunks=[(q0, n, s0, lt(ks)) for q0, n, s0, ks in chunks], logit_rows=lt(logit_rows),
                   state_slots=lt(row_slots) if states else None, chunk_state_slots=tuple(chunk_slots))


class PagedKVCache:
    attend_takes_chunk = True       # attend(..., chunk=): llama4's chunked layers (models/llama4.py asks)

    def __init__(self, n_layers: int, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 device="cpu", dtype=torch.float32, layers: tuple | None = None, v_in_k: int = 0,
                 states: tuple | None = None, n_seqs: int = 0) -> None:
        """layers: per-layer (Hkv, Dk, Dv) or None (no storage), runtime/kv_cache.py's kv_layers.
        v_in_k > 0 (deepseek2's MLA latent, ModelConfig.cache_v_in_k): V is no tensor of its own
        but the view k[..., :v_in_k] (each slot's V row the first v_in_k dims of its K row, stored
        and written once, as KVCache's); attend() gives (T, H, v_in_k).
        states (kv_cache.state_layers: per layer None or its recurrent state's shapes): a pool of
        n_seqs + 1 state slots (runtime/paged_state.py), self.states; None: no recurrent state."""
        self.n_layers, self.n_blocks, self.block_size = n_layers, n_blocks, block_size
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.layers = layers
        self.v_in_k = int(v_in_k or 0)
        if layers is not None:
            if len(layers) != n_layers:
                raise MinferError(f"PagedKVCache: per-layer geometry of {len(layers)} layers for {n_layers}")
            self.k, self.v = layer_views(n_blocks * block_size, layers, self.v_in_k, device, dtype, "PagedKVCache")
        else:
            shape = (n_layers, n_blocks * block_size, n_kv_heads, head_dim)
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            if self.v_in_k:
                if not 0 < self.v_in_k < head_dim:
                    raise MinferError(f"PagedKVCache: V as the first {self.v_in_k} dims of K rows of {head_dim}")
                self.v = self.k[..., :self.v_in_k]
            else:
                self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.states = None
        if states is not None:
            from minfer.runtime.paged_state import PagedStatePool

            self.states = PagedStatePool(states, int(n_seqs) + 1, device)
        self.step: PagedStep | None = None   # set by the engine before each forward
        self.decode_attention = None         # CUDA: the Triton kernel (set by the engine; with v_in_k
                                             # ops/cuda/paged_attention_mla.paged_mla_decode)

    @classmethod
    def for_config(cls, cfg, n_blocks: int, block_size: int, device="cpu", dtype=torch.float32,
                   n_seqs: int = 1) -> "PagedKVCache":
        """n_seqs: the sequences that run at once (the state pool's slots, with state_layers)."""
        return cls(cfg.n_layers, n_blocks, block_size, cfg.n_kv_heads, cfg.head_dim, device, dtype,
                   layers=kv_layers(cfg), v_in_k=getattr(cfg, "cache_v_in_k", 0),
                   states=state_layers(cfg), n_seqs=n_seqs)

    @staticmethod
    def bytes_per_block(cfg, block_size: int, dtype=torch.float32) -> int:
        """What one block allocates: kv_bytes_per_position (the preflight's number: K only where V
        is a view of it) times the block's positions; at least 1, so that the pool's arithmetic
        (plan_pool, the preflight) holds for a model with no K/V rows at all (mamba2: its blocks
        allocate nothing, its per-sequence state is sized apart, runtime/paged_state.py)."""
        return max(1, kv_bytes_per_position(cfg, torch.empty((), dtype=dtype).element_size()) * block_size)

    def v_is_view(self) -> bool:
        """V is the view of K's first dims (v_in_k): stored, and written, once."""
        return self.v_in_k > 0

    def nbytes(self) -> int:
        k = self.k.numel() * self.k.element_size()
        s = self.states.nbytes() if self.states is not None else 0
        return s + (k if self.v_is_view() else k + self.v.numel() * self.v.element_size())

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's pools as (n_blocks, block_size, Hkv, Dh) views."""
        if self.layers is not None:
            kl, vl = self.k[layer], self.v[layer]
            return (kl.view(self.n_blocks, self.block_size, *kl.shape[1:]),
                    vl.view(self.n_blocks, self.block_size, *vl.shape[1:]))
        shape = (self.n_blocks, self.block_size, self.n_kv_heads)
        return self.k[layer].view(*shape, self.head_dim), self.v[layer].view(*shape, self.v.shape[-1])

    # ---- what the model calls ------------------------------------------------------------------

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, step=None) -> None:
        """Store the step's keys/values k, v (T, Hkv, Dh) at their slots (the Cache protocol,
        docs/interfaces.md; the model's Step is not needed: the PagedStep has the slots)."""
        st = self.step
        kl, vl = self.k[layer], self.v[layer]
        kl.index_copy_(0, st.slots, k.to(kl.dtype))
        if not self.v_is_view():         # V a view of K (v_in_k): written with K (v must be those dims)
            vl.index_copy_(0, st.slots, v.to(vl.dtype))

    def write_rotated(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step, rope,
                      ctx=None) -> torch.Tensor:
        """rope(q) returned; rope(k) and v stored at the step's slots (the optional Cache protocol
        method, as kv_cache.KVCache's): on CUDA one kernel (ops.rope_kv_write with rows = slots)
        where it applies, else rope, rope and write()."""
        st = self.step
        if self.k.device.type == "cuda" and not self.v_is_view():
            out = ops.rope_kv_write(q, k, v, st.positions, rope, self.k[layer], self.v[layer], ctx, rows=st.slots)
            if out is not None:
                return out
        q = ops.rope(q, st.positions, rope)
        self.write(layer, ops.rope(k, st.positions, rope), v, step)
        return q

    def attend(self, layer: int, q: torch.Tensor, step=None, ctx=None, window: int = 0,
               softcap: float = 0.0, sinks: torch.Tensor | None = None,
               scale: float | None = None, chunk: int = 0) -> torch.Tensor:
        """q (T, H, Dh) of the step's tokens -> attention output (T, H, Dv), after write()
        (Dv = Dh unless v_in_k: decode rows by _mla_decode, chunks' V the keys' first dims).
        window > 0 (sliding-window layers): a query at position p sees keys (p - window, p].
        chunk > 0 (llama4's chunked layers): a query at p sees keys [p // chunk * chunk, p]
        (llama.cpp llama-hparams.cpp is_masked_swa, LLAMA_SWA_TYPE_CHUNKED).
        softcap > 0 (gemma2): scores s -> softcap * tanh(s / softcap). sinks (H,) (gpt-oss): each
        query head's extra softmax logit with no value. scale: the scores' factor (None:
        1/sqrt(Dh); gemma4 passes 1.0), in every path.
        Decode rows: the Triton kernel where set (CUDA), with its WINDOW / CHUNK / CAP / SINK
        variants, counted attention.paged_decode[.softcap][.window][.chunked][.sinks].triton; else
        paged_attention_ref (a loop over rows: the CPU's, counted attention.paged_decode.<variant>.torch
        when it has a window, chunk or softcap). Chunks: windowed_attention with a window or softcap
        (torch, counted attention.paged_prefill.<variant>.torch per chunk); with a chunk alone the
        step's chunk cut at the attention-chunk boundaries, each piece through ops.attention over its
        own attention chunk's keys (the contiguous llama4 path's kernels; counted
        attention.paged_prefill.chunked.pieces per step chunk); else ops.attention (with the sinks)."""
        st = self.step
        nd = st.n_decode
        parts = []
        chunk = max(0, int(chunk))
        variant = ((".softcap" if softcap > 0 else "") + (".window" if window else "")
                   + (".chunked" if chunk else "") + (".sinks" if sinks is not None else ""))
        if nd:
            kp, vp = self.pages(layer)
            mla = self._mla_decode(q[:nd], kp, vp, window, softcap, sinks, scale, chunk)
            if mla is not None:
                parts.append(mla)
            elif self.decode_attention is not None:
                paths.count(f"attention.paged_decode{variant}.triton")
                kw = {} if sinks is None else {"sinks": sinks}
                if window:
                    kw["window"] = window
                if softcap > 0:
                    kw["softcap"] = softcap
                if chunk:
                    kw["chunk"] = chunk
                if scale is not None:
                    kw["scale"] = scale
                parts.append(self.decode_attention(q[:nd], kp, vp, st.block_tables, st.context_lens, **kw))
            else:
                if window or softcap > 0 or chunk:
                    paths.count(f"attention.paged_decode{variant}.torch")
                parts.append(paged_attention_ref(q[:nd], kp, vp, st.block_tables, st.context_lens, window,
                                                 softcap, sinks, scale, chunk))
        kl, vl = self.k[layer], self.v[layer]
        pieces = chunk and not (window or softcap > 0)
        for q0, n, s0, key_slots in st.chunks:
            base = s0 // chunk * chunk if pieces else 0      # pieces: no key before the first one's chunk
            key_slots = key_slots[base:]
            kc = kl.index_select(0, key_slots)                                   # (s0 + n - base, Hkv, Dh)
            # v_in_k: the gathered keys' first dims, a view (ops.attention's MLA paths: V in K)
            vc = kc[..., :self.v_in_k] if self.v_is_view() else vl.index_select(0, key_slots)
            qc = q[q0:q0 + n]
            if window or softcap > 0:
                paths.count(f"attention.paged_prefill{variant}.torch")
                parts.append(windowed_attention(qc, kc, vc, s0, window, softcap, sinks, scale, chunk))
            elif pieces:
                paths.count("attention.paged_prefill.chunked.pieces")
                parts += _chunk_pieces(qc, kc, vc, s0, chunk, ctx, sinks, scale, base)
            else:
                parts.append(ops.attention(qc, kc, vc, s0, ctx, sinks=sinks, scale=scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _mla_decode(self, q, kp, vp, window, softcap, sinks, scale, chunk=0) -> torch.Tensor | None:
        """Decode rows over a V-in-K cache (v_in_k: deepseek2's latent): the paged MLA kernel where
        the engine set one (CUDA: ops/cuda/paged_attention_mla.paged_mla_decode, counted
        attention.paged_decode.mla.triton; a window, cap or sinks, which it has not, a counted
        fallback), else paged_attention_ref (counted attention.paged_decode.mla.torch).
        None: not a V-in-K cache (the caller's paths)."""
        if not self.v_is_view():
            return None
        st = self.step
        if self.decode_attention is not None:
            from minfer.ops.cuda.paged_attention_mla import PATH, paged_mla_refusal

            why = paged_mla_refusal(q, kp, vp, window, softcap, sinks) or (chunk and "chunked attention")
            if not why:
                paths.count(PATH)
                return self.decode_attention(q, kp, vp, st.block_tables, st.context_lens, scale=scale)
            paths.fallback(PATH, why)
        paths.count("attention.paged_decode.mla.torch")
        return paged_attention_ref(q, kp, vp, st.block_tables, st.context_lens, window, softcap, sinks, scale,
                                   chunk)

    def write_window(self, layer: int, x: torch.Tensor, step, n: int) -> torch.Tensor:
        """A short-convolution layer (lfm2; kv_layers entry (1, W, 0)): x (T, W) stored at the step's
        slots, each token's rows of positions p - n + 1 .. p (T, n, W) read back through its sequence's
        pages (decode rows: their block tables; chunks: their key slots), zeros before position 0
        (runtime/kv_cache.py KVCache.write_window)."""
        from minfer.runtime.kv_cache import window_index, window_rows

        st = self.step
        T, W = x.shape
        kl = self.k[layer]
        kl.index_copy_(0, st.slots, x.view(T, 1, W).to(kl.dtype))
        index, valid = window_index(st.positions, n)            # (T, n) positions, clamped at 0
        slots = []
        nd = st.n_decode
        if nd:
            p, bs = index[:nd], self.block_size
            blocks = st.block_tables.long().gather(1, torch.div(p, bs, rounding_mode="floor"))
            slots.append(blocks * bs + p % bs)
        for q0, m, s0, key_slots in st.chunks:
            slots.append(key_slots[index[q0:q0 + m]])
        slots = slots[0] if len(slots) == 1 else torch.cat(slots)
        return window_rows(kl.view(-1, W), slots, valid)

    def recurrent_state(self, layer: int):
        """A recurrent layer's state for the current step (the Cache protocol's optional method;
        runtime/paged_state.py BatchState: the layer's slot pools and each decode row's / chunk's
        slot), which models/mamba2.py conv_scan_batch reads and updates in place."""
        if self.states is None:
            raise MinferError(f"PagedKVCache: layer {layer} keeps no recurrent state (the config has no state_layers)")
        return self.states.view(layer, self.step)


def _chunk_pieces(q, k, v, start: int, chunk: int, ctx, sinks, scale, base: int = 0) -> list:
    """q (T, H, Dh) at positions start.. over the keys k/v of positions base.. (base <= start's
    chunk start; through start + T or more, Hkv, Dh: any keys past the last query are causally
    masked) with llama4's chunks: the queries cut at the multiples of chunk, each piece causal over
    its own chunk's keys, from cs = p // chunk * chunk (ops.attention at start p - cs over the keys
    from cs; models/llama4.py's contiguous path likewise) -> the pieces' outputs."""
    out, p, end = [], start, start + q.shape[0]
    while p < end:
        cs = p // chunk * chunk
        b = min(end, cs + chunk)
        out.append(ops.attention(q[p - start:b - start], k[cs - base:], v[cs - base:], p - cs, ctx, sinks=sinks,
                                 scale=scale))
        p = b
    return out


def _visible(p: torch.Tensor, j: torch.Tensor, window: int, chunk: int) -> torch.Tensor:
    """Key positions j visible from query positions p (broadcast): causal, within the window
    (p - j < window) and the chunk (j >= p // chunk * chunk: llama.cpp is_masked_swa's
    LLAMA_SWA_TYPE_STANDARD and _CHUNKED) where those are > 0."""
    mask = j <= p
    if window:
        mask = mask & (p - j < window)
    if chunk:
        mask = mask & (j >= torch.div(p, chunk, rounding_mode="floor") * chunk)
    return mask


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, window: int,
                       softcap: float = 0.0, sinks: torch.Tensor | None = None,
                       scale: float | None = None, chunk: int = 0) -> torch.Tensor:
    """q (T, H, Dh) at positions start.. over keys k/v (start + T, Hkv, Dh): query at p sees
    keys j with 0 <= p - j < window (llama.cpp's sliding-window mask; window 0: every j <= p)
    and, with chunk > 0, j >= p // chunk * chunk (its own chunk), scores times scale (default
    1/sqrt(Dh)), soft-capped when softcap > 0; sinks (H,): each head's extra softmax logit with
    no value (_softmax_with_sinks). -> (T, H, Dh)"""
    T, H, D = q.shape
    S, hkv = k.shape[0], k.shape[1]
    p = start + torch.arange(T, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    mask = _visible(p, j, window, chunk)                                      # (T, S)
    kh = k.float().repeat_interleave(H // hkv, dim=1).transpose(0, 1)        # (H, S, Dh)
    vh = v.float().repeat_interleave(H // hkv, dim=1).transpose(0, 1)
    s = (q.float().transpose(0, 1) @ kh.transpose(1, 2)) * _scale(scale, D)   # (H, T, S)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf"))
    return (_softmax_with_sinks(s, sinks) @ vh).transpose(0, 1).to(q.dtype)


def paged_attention_ref(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor, window: int = 0,
                        softcap: float = 0.0, sinks: torch.Tensor | None = None,
                        scale: float | None = None, chunk: int = 0) -> torch.Tensor:
    """The reference: each row's keys gathered through its block table, softmax(scale q k^T) v
    (scale default 1/sqrt(Dh)).

    q (B, H, Dh); pages (n_blocks, block_size, Hkv, Dh); block_tables (B, M) int; context_lens
    (B,) int -> (B, H, Dh). Query head h reads KV head h // (H / Hkv) (GQA, as ggml broadcasts).
    window > 0: only the last `window` keys. chunk > 0: only the keys of the row's own chunk, from
    (n - 1) // chunk * chunk (llama4). softcap > 0: scores s -> softcap * tanh(s / softcap).
    sinks (H,): each head's extra softmax logit with no value (_softmax_with_sinks).
    """
    B, H, D = q.shape
    bs, hkv = k_pages.shape[1], k_pages.shape[2]
    g = H // hkv
    out = q.new_empty(B, H, v_pages.shape[-1])                           # (B, H, Dv)
    for b in range(B):
        n = int(context_lens[b])
        nb = -(-n // bs)
        blocks = block_tables[b, :nb].long()
        k = k_pages[blocks].reshape(nb * bs, hkv, D)[:n].float()            # (n, Hkv, Dh)
        v = v_pages[blocks].reshape(nb * bs, hkv, -1)[:n].float()
        lo = max(0, n - window) if window else 0
        if chunk:
            lo = max(lo, (n - 1) // chunk * chunk)
        k, v = k[lo:], v[lo:]
        k = k.repeat_interleave(g, dim=1).transpose(0, 1)                   # (H, n, Dh)
        v = v.repeat_interleave(g, dim=1).transpose(0, 1)
        s = (k @ q[b].float()[:, :, None]).squeeze(-1) * _scale(scale, D)   # (H, n)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        out[b] = (_softmax_with_sinks(s, sinks)[:, None, :] @ v).squeeze(1).to(q.dtype)
    return out


def _scale(scale: float | None, d: int) -> float:
    return 1.0 / d ** 0.5 if scale is None else float(scale)


def _softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim of scores s (H, ..., S); sinks (H,): one more logit per head in
    each denominator, its column dropped: p_j = exp(s_j) / (exp(sink_h) + sum_i exp(s_i))
    (minfer.ops.reference.attention's sinks; ggml_soft_max_add_sinks)."""
    if sinks is None:
        return torch.softmax(s, -1)
    col = sinks.float().to(s.device).view(-1, *([1] * (s.dim() - 1))).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat((s, col), -1), -1)[..., :-1]
