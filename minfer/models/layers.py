"""The pieces shared by the llama-family models: a block's weights, attention, feed-forward.

Names follow the GGUF tensor names (`blk.N.attn_q.weight` -> Block.attn_q), so loading needs
no rename table. All math goes through minfer.ops, which picks the CPU or CUDA version; the
KV cache is reached only through the cache protocol (write, attend: docs/interfaces.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class Block:
    """One transformer layer's weights. Optional tensors are None where the architecture has none."""

    attn_norm: torch.Tensor          # (D,)
    attn_q: QWeight                  # (H*Dh, D)
    attn_k: QWeight                  # (Hkv*Dh, D)
    attn_v: QWeight                  # (Hkv*Dh, D)
    attn_output: QWeight             # (D, H*Dh)
    ffn_norm: torch.Tensor           # (D,)
    ffn_gate: QWeight                # (F, D)
    ffn_up: QWeight                  # (F, D)
    ffn_down: QWeight                # (D, F)
    attn_q_bias: torch.Tensor | None = None  # (H*Dh,)     qwen2
    attn_k_bias: torch.Tensor | None = None  # (Hkv*Dh,)
    attn_v_bias: torch.Tensor | None = None  # (Hkv*Dh,)
    attn_q_norm: torch.Tensor | None = None  # (Dh,)       qwen3: RMSNorm of each q head
    attn_k_norm: torch.Tensor | None = None  # (Dh,)       qwen3: RMSNorm of each k head

    def matrices(self) -> list[QWeight]:
        """The block's matrices that exist (glm4 has no separate ffn_gate)."""
        return [w for w in (self.attn_q, self.attn_k, self.attn_v, self.attn_output, self.ffn_gate, self.ffn_up,
                            self.ffn_down) if w is not None]


def optional_vector(gf, name: str, device, n: int, zero: bool = False) -> torch.Tensor | None:
    """load_vector of tensor `name` when the file has it; else zeros (n,) when zero, else None."""
    if name in gf.tensors:
        return load_vector(gf, name, device, n)
    return torch.zeros(n, dtype=torch.float32, device=device) if zero else None


class BlockTensors:
    """Layer i's tensors by their name after `blk.{i}.` (the shared part of every load_block):
    w(name, shape) the matrix `blk.i.<name>.weight`, v(name, n) the vector `blk.i.<name>`,
    opt(name, n) that vector or None when the file lacks it, has(name). The widths: D, F (ffn),
    Dh, q_out (H * Dh), kv_out (Hkv * Dh). Loading goes through weights.load_qweight /
    load_vector, whose errors name the file and the full tensor name."""

    def __init__(self, gf, cfg, i: int, device, dtype):
        self.gf, self.p, self.device, self.dtype = gf, f"blk.{i}.", device, dtype
        self.D, self.F, self.Dh = cfg.d_model, cfg.ffn, cfg.head_dim
        self.q_out, self.kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    def has(self, name: str) -> bool:
        return self.p + name in self.gf.tensors

    def w(self, name: str, shape: tuple[int, int]) -> QWeight:
        return load_qweight(self.gf, self.p + name + ".weight", self.device, shape, dtype=self.dtype)

    def v(self, name: str, n: int) -> torch.Tensor:
        return load_vector(self.gf, self.p + name, self.device, n)

    def opt(self, name: str, n: int, zero: bool = False) -> torch.Tensor | None:
        return optional_vector(self.gf, self.p + name, self.device, n, zero)

    def ln_attention(self) -> dict:
        """A LayerNorm-with-bias block's attention tensors (nemotron, stablelm) as Block keyword
        arguments, loaded in this order: attn_norm.weight and attn_norm.bias (required), attn_q / k / v,
        their biases when present, attn_output (no bias: the caller adds attn_output_b if it has one)."""
        w, v, opt, D, q_out, kv_out = self.w, self.v, self.opt, self.D, self.q_out, self.kv_out
        return dict(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
            attn_q_bias=opt("attn_q.bias", q_out), attn_k_bias=opt("attn_k.bias", kv_out),
            attn_v_bias=opt("attn_v.bias", kv_out), attn_output=w("attn_output", (D, q_out)))


def each_block(gf, cfg, blocks: list, device, dtype):
    """(layer i's BlockTensors, blocks[i]) for every layer: where a subclass loads its extra tensors
    onto the Blocks its parent's from_gguf built (olmoe, phimoe)."""
    for i, blk in enumerate(blocks):
        yield BlockTensors(gf, cfg, i, device, dtype), blk


def refuse_expert_weights_scale(gf, arch: str) -> None:
    """Refuse `<arch>.expert_weights_scale` other than 0 or 1 (absent is fine): llama.cpp's build_moe_ffn
    would scale the routing weights by it, and the MoE FFN of models/qwen3moe.py does not (olmoe, phimoe)."""
    ws = gf.metadata.get(f"{arch}.expert_weights_scale")
    if ws is not None and float(ws) not in (0.0, 1.0):
        raise MinferError(f"{gf.path}: metadata key '{arch}.expert_weights_scale' is {ws}, which is not "
                          "supported (0 or 1)")


def load_block(gf, cfg, i: int, device, dtype, qkv_bias: bool = False, qk_norm: bool = False) -> Block:
    t = BlockTensors(gf, cfg, i, device, dtype)
    D, F, Dh, q_out, kv_out = t.D, t.F, t.Dh, t.q_out, t.kv_out
    blk = Block(
        attn_norm=t.v("attn_norm.weight", D),
        attn_q=t.w("attn_q", (q_out, D)),
        attn_k=t.w("attn_k", (kv_out, D)),
        attn_v=t.w("attn_v", (kv_out, D)),
        attn_output=t.w("attn_output", (D, q_out)),
        ffn_norm=t.v("ffn_norm.weight", D),
        ffn_gate=t.w("ffn_gate", (F, D)),
        ffn_up=t.w("ffn_up", (F, D)),
        ffn_down=t.w("ffn_down", (D, F)),
    )
    if qkv_bias:
        blk.attn_q_bias = t.v("attn_q.bias", q_out)
        blk.attn_k_bias = t.v("attn_k.bias", kv_out)
        blk.attn_v_bias = t.v("attn_v.bias", kv_out)
    if qk_norm:
        blk.attn_q_norm = t.v("attn_q_norm.weight", Dh)
        blk.attn_k_norm = t.v("attn_k_norm.weight", Dh)
    return blk


def load_head(gf, cfg, token_embd: QWeight, device, dtype) -> tuple[torch.Tensor, QWeight]:
    """The final norm (D,) and the lm head (V, D): `output.weight`, or the embedding when tied."""
    V, D = cfg.vocab, cfg.d_model
    output_norm = load_vector(gf, "output_norm.weight", device, D)
    output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
    return output_norm, output


def require_output(gf, cfg, arch: str) -> None:
    """Refuse a file without `output.weight` where the lm head is never tied (llama.cpp's
    load_arch_tensors: output with flag 0; nemotron, stablelm)."""
    if cfg.tied_output:
        raise MinferError(f"{gf.path}: tensor 'output.weight' is missing ({arch}'s lm head is its own: "
                          "llama.cpp's loader requires it)")


def refuse_layer_tensors(gf, cfg, suffixes, why: str) -> None:
    """Refuse the first `blk.N.<suffix>` tensor the file has (layer by layer), for tensors an architecture's llama.cpp
    loader does not create or its graph does not read; `why` goes in the message's parentheses."""
    for i in range(cfg.n_layers):
        for suffix in suffixes:
            if f"blk.{i}.{suffix}" in gf.tensors:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cfg.arch} ({why})")


def refuse_per_layer_shapes(gf, cfg, why: str = "") -> None:
    """Refuse per-layer head counts or FFN widths (arrays in the file) where the architecture sizes every layer
    alike; `why`, when given, follows in parentheses."""
    if any(v is not None for v in (cfg.heads_per_layer, cfg.kv_heads_per_layer, cfg.ffn_per_layer)):
        raise MinferError(f"{gf.path}: per-layer head counts or FFN widths are not supported for {cfg.arch}"
                          + (f" ({why})" if why else ""))


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x (T, H, Dh), per head, in x's dtype."""
    T, H, Dh = x.shape
    return ops.rms_norm(x.reshape(T * H, Dh), weight, eps).view(T, H, Dh)


def attention_branch(h: torch.Tensor, blk: Block, cfg, cache, layer: int, step, ctx) -> torch.Tensor:
    """Causal self-attention of the normed input h (T, D) -> W_o attn(...) (T, D), h's dtype.

    The rotated keys and values of this step go to the cache (cache.write); attention reads
    what the cache gives for the step (cache.attend)."""
    return ops.linear(attention_heads(h, blk, cfg, cache, layer, step, ctx), blk.attn_output, None, ctx)


def attention_residual_norm(h: torch.Tensor, blk: Block, cfg, cache, layer: int, step, ctx, x: torch.Tensor,
                            norm_weight: torch.Tensor, eps: float, out_dtype) -> tuple:
    """(x + attention_branch(h), its RMSNorm by norm_weight in out_dtype): the attention with the
    residual add and the FFN norm after it (ops.linear_add_rms_norm, role ffn_norm). The norm's
    output goes to the FFN's GEMVs only (into_linear), which may apply its scale on CUDA."""
    return ops.linear_add_rms_norm(attention_heads(h, blk, cfg, cache, layer, step, ctx), blk.attn_output, x,
                                   norm_weight, eps, out_dtype, ctx, into_linear=True, role="ffn_norm")


def attention_heads(h: torch.Tensor, blk: Block, cfg, cache, layer: int, step, ctx) -> torch.Tensor:
    """The attention's heads before the o projection, merged: (T, H * Dh) in h's dtype."""
    T = h.shape[0]
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    wts, biases = (blk.attn_q, blk.attn_k, blk.attn_v), (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias)
    project = getattr(cache, "project_rotated", None)
    if project is not None and blk.attn_q_norm is None:
        # one decode row: the q/k/v GEMV rotates q and k and writes the KV row itself (Switches.qkv_rope)
        q = project(layer, h, wts, biases, step, cfg.rope, ctx)
        if q is not None:
            return merge_heads(cache.attend(layer, q.view(T, H, Dh), step, ctx))
    q, k, v = ops.linear_many(h, wts, biases, ctx)
    q, k = q.view(T, H, Dh), k.view(T, Hkv, Dh)
    if blk.attn_q_norm is not None:
        q, k = head_norm(q, blk.attn_q_norm, cfg.rms_eps), head_norm(k, blk.attn_k_norm, cfg.rms_eps)
    o = rope_write_attend(cache, layer, q, k, v.view(T, Hkv, Dh), step, cfg.rope, ctx)   # (T, H, Dh)
    return merge_heads(o)


def rope_write_attend(cache, layer: int, q, k, v, step, rope, ctx, window: int = 0):
    """Rotate q and k, store k and v in the cache, attend -> (T, H, Dh). A cache with the
    optional `attend_rotated` (runtime/kv_cache.py: one decode token on CUDA, all in the
    attention kernel) does it all when it can; else rope_and_write, then cache.attend.
    rope None: a layer without rope (NoPE: command-r's, exaone4's, afmoe's, muse-glimmer's global
    layers): store k and v as they are, then attend."""
    if rope is None:
        cache.write(layer, k, v, step)
        return cache.attend(layer, q, step, ctx, window=window)
    fused = getattr(cache, "attend_rotated", None)
    if fused is not None:
        o = fused(layer, q, k, v, step, rope, ctx, window=window)
        if o is not None:
            return o
    q = rope_and_write(cache, layer, q, k, v, step, rope, ctx)
    return cache.attend(layer, q, step, ctx, window=window)


def rope_and_write(cache, layer: int, q, k, v, step, rope, ctx):
    """Rotate q and k, store k and v in the cache; the rotated q. A cache with the optional
    `write_rotated` (runtime/kv_cache.py: one kernel on CUDA) does it all; else rope, rope, write."""
    fused = getattr(cache, "write_rotated", None)
    if fused is not None:
        return fused(layer, q, k, v, step, rope, ctx)
    q = ops.rope(q, step.positions, rope)
    cache.write(layer, ops.rope(k, step.positions, rope), v, step)
    return q


def merge_heads(o: torch.Tensor) -> torch.Tensor:
    """(T, H, Dh) -> (T, H*Dh), keeping the int8 form the CUDA decode attention attaches to its
    one-row output (`.q8`, for the o projection's q8 GEMV: ops/cuda/gemv_q8.py)."""
    out = o.reshape(o.shape[0], -1)
    q8 = getattr(o, "q8", None)
    if q8 is not None:
        out.q8 = q8
    return out


def ffn_hidden(h: torch.Tensor, blk: Block, ctx, into_linear: bool = False) -> torch.Tensor:
    """The SwiGLU MLP's hidden row silu(W_gate h) * W_up h, (T, D) -> (T, F). into_linear: the
    caller passes it to the down projection only (ops.swiglu's)."""
    # one GEMV in decode when the two share repacked planes (Model.decode_groups), SwiGLU in its
    # epilogue (ops.linear_swiglu); apart in prefill
    a = ops.linear_swiglu(h, blk.ffn_gate, blk.ffn_up, ctx)
    if a is None:
        gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
        a = ops.swiglu(gate, up, ctx, into_linear=into_linear, down=blk.ffn_down if into_linear else None)
    return a


def ffn_branch(h: torch.Tensor, blk: Block, ctx) -> torch.Tensor:
    """SwiGLU MLP of the normed input: W_down(silu(W_gate h) * W_up h). (T, D) -> (T, D)."""
    return ops.linear(ffn_hidden(h, blk, ctx, into_linear=True), blk.ffn_down, None, ctx)


def ffn_residual_norm(h: torch.Tensor, blk: Block, x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                      out_dtype, ctx) -> tuple:
    """(x + ffn(h), its RMSNorm by norm_weight in out_dtype): the block's MLP with the residual
    add and the next layer's attention norm (ops.linear_add_rms_norm). The norm's output goes
    to that layer's q/k/v GEMV only (into_linear), which may do the norm itself on CUDA."""
    return ops.linear_add_rms_norm(ffn_hidden(h, blk, ctx, into_linear=True), blk.ffn_down, x, norm_weight, eps,
                                   out_dtype, ctx, into_linear=True)
