"""The operations a model is written against, dispatched on the device of the input tensor.

CPU -> minfer.ops.reference (torch float32, the reference every kernel is checked against);
CUDA -> minfer.ops.cuda (Triton), imported on first use. Signatures: docs/interfaces.md.

`ctx` (minfer.ops.context.Context: the engine's switches and workspace) is passed to the ops
whose CUDA version has a fast path to switch or buffers to use; the reference ignores it.
ops/ imports nothing from runtime/, models/, bench/ or commands/ (tests/test_imports.py).
"""

from __future__ import annotations

from minfer.ops import paths, reference
from minfer.ops.context import DEFAULT, Context

__all__ = ["Context", "LENGTH_BUCKET", "linear", "linear_many", "embedding", "rms_norm", "add_rms_norm",
           "linear_add_rms_norm", "layer_norm",
           "rope", "rope_kv_write", "linear_qkv_rope", "swiglu", "geglu", "attention", "moe_ffn"]

# Prefill attention on CUDA rounds its length up to a multiple of this (one cuDNN plan per
# bucket, docs/perf-log.md section 10), so the KV cache has rows up to the next multiple past
# the context, and prefill CUDA graphs pad prompts to it. Defined here once.
LENGTH_BUCKET = 128


def _backend(x):
    if x.device.type != "cuda":
        return reference
    from minfer.device import cuda_backend

    return cuda_backend()


def linear(x, w, bias=None, ctx: Context | None = None, out_dtype=None):
    """x (T, K) @ w (N, K)^T + bias (N,) -> (T, N) in out_dtype (None: x's dtype; the lm head asks
    float32, which the CUDA one-row GEMV stores without a conversion launch)."""
    if x.device.type != "cuda":
        out = _cpu_linear(x, w, bias, ctx)
        return out if out_dtype is None else out.to(out_dtype)
    return _backend(x).linear(x, w, bias, ctx, out_dtype=out_dtype)


def _cpu_linear(x, w, bias, ctx):
    """The int8 fast path for a weight Engine.load packed (minfer/ops/cpu_quant.py), else the
    float32 reference; a reference matmul under switches that wanted the fast path is counted."""
    if w.packed is not None:
        from minfer.ops import cpu_quant

        return cpu_quant.linear(x, w.packed, bias)
    if ctx is not None and ctx.switches.cpu_quant is False:
        from minfer.ops import paths

        paths.switched_off("cpu.int8", "MINFER_CPU_QUANT")
    return reference.linear(x, w, bias)


def linear_many(x, ws, biases, ctx: Context | None = None):
    """The same input through several weights (q/k/v): x (T, K) -> [(T, N_i)].

    On CUDA a group the model declared (Model.linear_groups) goes through one scratch and one
    GEMM; the reference runs each weight through linear()."""
    if x.device.type != "cuda":
        return [_cpu_linear(x, w, b, ctx) for w, b in zip(ws, biases)]
    return _backend(x).linear_many(x, ws, biases, ctx)


def linear_swiglu(x, gate, up, ctx: Context | None = None):
    """silu(x @ gate^T) * (x @ up^T) in ONE launch when the CUDA decode row can (the pair's fused
    repacked planes and the row's int8 form; qmatmul.linear_swiglu), with its own int8 form
    attached; None otherwise (the caller runs linear_many + swiglu, the reference everywhere)."""
    if x.device.type != "cuda":
        return None
    return _backend(x).linear_swiglu(x, (gate, up), ctx)


def embedding(ids, w):
    """ids (T,) int64 -> rows of w, (T, D) float32."""
    return _backend(ids).embedding(ids, w)


def rms_norm(x, weight, eps):
    """x (T, D) -> x / rms(x) * weight, (T, D)."""
    return _backend(x).rms_norm(x, weight, eps)


def rms_norm_cast(x, weight, eps, out_dtype, ctx: Context | None = None):
    """rms_norm(x, weight) in out_dtype (the first layer's input). On CUDA one decode row also
    gets its int8 form (`.q8`, for the q8 GEMV) from the same launch."""
    if x.device.type != "cuda":
        return reference.rms_norm(x, weight, eps).to(out_dtype)
    return _backend(x).rms_norm_cast(x, weight, eps, out_dtype, ctx)


def layer_norm(x, weight, eps, out_dtype=None):
    """x (N, D) -> (x - mean) / sqrt(var + eps) * weight in out_dtype (None: x's dtype), no bias
    (command-r, cohere2). weight (D,), or (G, D): row r takes weight[r % G] (per-head q/k norms).
    CPU: reference.layer_norm; CUDA: the Triton kernel ops/cuda/layer_norm.py (`layer_norm.triton`)."""
    return _backend(x).layer_norm(x, weight, eps, out_dtype)


def add_rms_norm(x, y, weight, eps, out_dtype, ctx: Context | None = None, into_linear: bool = False):
    """(s, h): s = x + y (T, D), the residual stream; h = rms_norm(s) * weight in out_dtype.
    into_linear: the caller passes h to ops.linear / linear_many only, so on CUDA the norm may
    be left to that GEMV (Switches.norm_into_gemv; ops/cuda/norm_rope_act.add_rms_norm)."""
    if x.device.type != "cuda":
        return reference.add_rms_norm(x, y, weight, eps, out_dtype)
    return _backend(x).add_rms_norm(x, y, weight, eps, out_dtype, ctx, into_linear=into_linear)


def linear_add_rms_norm(a, w, x, weight, eps, out_dtype, ctx: Context | None = None, into_linear: bool = False,
                        role: str = "attn_norm"):
    """(s, h): s = x + a @ w^T (the residual add of a block's matmul), h = rms_norm(s) * weight in
    out_dtype: linear, then add_rms_norm. role: attn_norm (the down projection and the next
    layer's attention norm) or ffn_norm (the o projection and the FFN norm). On CUDA one decode
    row may have the GEMV's epilogue make s and its sums of squares, and (into_linear) leave h to
    the GEMV that reads it (Switches.norm_into_gemv 2 and 4; ops/cuda/qmatmul.py)."""
    if a.device.type != "cuda":
        return reference.add_rms_norm(x, _cpu_linear(a, w, None, ctx), weight, eps, out_dtype)
    return _backend(a).linear_add_rms_norm(a, w, x, weight, eps, out_dtype, ctx, into_linear=into_linear, role=role)


def rope(x, positions, cfg):
    """x (T, H, Dh), positions (T,) int64, cfg: minfer.config.RopeConfig -> (T, H, Dh)."""
    return _backend(x).rope(x, positions, cfg)


def rope_kv_write(q, k, v, positions, cfg, k_cache, v_cache, ctx: Context | None = None, rows=None):
    """CUDA: rope(q) returned, rope(k) and v written to rows `positions` (or `rows`: a paged
    cache's slots) of the caches, in one kernel; None when the fused kernel does not apply (partial rotary dims, mixed dtypes, or
    Switches.fused_rope_kv off) -- the caller then runs rope, rope and its own write."""
    if q.device.type != "cuda":
        return None
    sw = (ctx or DEFAULT).switches
    if not sw.fused_rope_kv:
        paths.switched_off("rope_kv.triton", "MINFER_FUSED_ROPE_KV")
        return None
    if cfg.n_rot != q.shape[-1] or not (q.dtype == k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
        return None
    from minfer.ops.cuda.pdl import enabled

    return _backend(q).rope_kv_write(q, k, v, positions, cfg, k_cache, v_cache,
                                     pdl=enabled(sw, q.device, "rope_kv", early_ok=True), rows=rows)


def linear_qkv_rope(x, ws, biases, positions, cfg, k_cache, v_cache, ctx: Context | None = None):
    """CUDA, one decode row x (1, D) through a layer's q/k/v weights ws: rope(q) (1, Hq * Dh)
    returned, rope(k) and v stored at row positions[0] of the layer's caches (S, Hkv, Dh), by the
    q/k/v GEMV's epilogue (Switches.qkv_rope, ops/cuda/gemv_q8_gluon_rope.py); None where that launch
    does not apply (the caller then runs linear_many and rope_kv_write / rope + write)."""
    if x.device.type != "cuda":
        return None
    return _backend(x).linear_qkv_rope(x, ws, biases, positions, cfg, k_cache, v_cache, ctx)


def rope_attention(q, k, v, positions, cfg, k_cache, v_cache, ctx: Context | None = None, window: int = 0,
                   softcap: float = 0.0):
    """CUDA, one decode token: rope(q) and rope(k), rope(k) and v stored at row positions[0] of the
    caches (S, Hkv, Dh), and the attention of rope(q) over rows [0, pos] -> (1, H, Dh), in the
    attention kernel's launches; None when that kernel does not apply (the caller then runs
    rope_kv_write / rope + write, and attention)."""
    if q.device.type != "cuda":
        return None
    return _backend(q).rope_attention(q, k, v, positions, cfg, k_cache, v_cache, ctx, window=window,
                                      softcap=softcap)


def swiglu(gate, up, ctx: Context | None = None, into_linear: bool = False, down=None):
    """silu(gate) * up, (T, F). into_linear: the caller passes the result only to ops.linear /
    linear_add_rms_norm (CUDA: the row may be left to the down GEMV, Switches.gemv_glu_prologue;
    down: that linear's weight, whose kernel the switch's default asks about)."""
    if gate.device.type != "cuda":
        return _backend(gate).swiglu(gate, up)
    return _backend(gate).swiglu(gate, up, ctx, into_linear=into_linear, down=down)


def attention(q, k_cache, v_cache, start_pos, ctx: Context | None = None, window: int = 0,
              softcap: float = 0.0, sinks=None, scale: float | None = None, chunk: int = 0, alibi=None):
    """q (T, H, Dh) at positions start_pos.., caches (S, Hkv, Dh) -> (T, H, Dh), causal.
    start_pos: an int, or a (1,) int64 device tensor (decode under a CUDA graph).
    window > 0: sliding-window layers (gemma3), a query at p sees keys p - window < j <= p.
    softcap > 0 (gemma2): scores s -> softcap * tanh(s / softcap) before the softmax.
    sinks (H,) float32 (gpt-oss): each head's extra softmax logit (reference.attention; on CUDA the
    decode kernel's SINK variant, T > 1 in torch: ops/cuda/attention.py).
    scale: the scores' factor (None: 1/sqrt(Dh), every architecture but deepseek2). v_cache may be
    narrower than k_cache (S, Hkv, Dv): deepseek2's latent values -> (T, H, Dv) (on CUDA one token by
    ops/cuda/attention_mla.py's kernel, attention.mla.decode.triton; T > 1 a counted torch path,
    attention.mla.torch).
    chunk > 0 (llama4's chunked layers): a query at p sees keys p // chunk * chunk <= j <= p (on CUDA the
    one-token step by the decode kernel's CHUNK variant, attention.chunked.decode).
    alibi (H,) float32 (bloom, mpt): per-head ALiBi slopes (reference.alibi_slopes), - m_h |p - j| added to
    the scaled scores; on CUDA a counted torch path for any T (attention.alibi.torch)."""
    if q.device.type != "cuda":
        return reference.attention(q, k_cache, v_cache, start_pos, window, softcap, sinks, scale, chunk, alibi)
    kw = {} if alibi is None else {"alibi": alibi}
    return _backend(q).attention(q, k_cache, v_cache, start_pos, ctx, window=window, softcap=softcap, sinks=sinks,
                                 scale=scale, chunk=chunk, **kw)


def geglu(gate, up):
    """gelu(gate) * up with GELU's tanh approximation (gemma3's FFN), (T, F)."""
    return _backend(gate).geglu(gate, up)


def moe_ffn(h, router, gate_exps, up_exps, down_exps, k: int, norm_weights: bool, ctx: Context | None = None, *,
            router_bias=None, gating: str = "softmax", gate_bias=None, up_bias=None, down_bias=None,
            act: str = "silu", alpha: float = 1.702, limit: float = 7.0, select_bias=None, n_group: int = 1,
            topk_group: int = 1, weights_scale: float = 1.0, router_in=None, down_scale=None):
    """Mixture of gated experts: h (T, D) -> (T, D); router (E, D), stacked expert QWeights
    (E*F, D), (E*F, D), (E*D, F). Defaults (qwen3moe): softmax over E, top-k, weights
    renormalized when norm_weights, silu(gate) * up. gpt-oss: router_bias (E,), gating
    "topk_softmax" (the k largest logits, softmax over those k), per-expert biases (E, F), (E, F),
    (E, D), act "swiglu_oai" (the clamped SwiGLU with alpha, limit). deepseek2 / glm4moe: gating
    "sigmoid" with select_bias (E,) (choice only), n_group / topk_group (group-limited choice) and
    weights_scale. gemma4: act "geglu" (gelu_tanh(gate) * up), router_in (T, D) the router's own
    input, down_scale (E,) per-expert output scale, and up_exps None with gate_exps the fused
    (E*2F, D) gate_up tensor. nemotron_h_moe: act "relu2" with gate_exps None (ungated experts,
    relu(up)^2). minfer/ops/reference.py moe_ffn and route; CUDA with no host value (ops/cuda/moe.py)."""
    opts = dict(router_bias=router_bias, gating=gating, gate_bias=gate_bias, up_bias=up_bias, down_bias=down_bias,
                act=act, alpha=alpha, limit=limit, select_bias=select_bias, n_group=n_group, topk_group=topk_group,
                weights_scale=weights_scale, router_in=router_in, down_scale=down_scale)
    if h.device.type != "cuda":
        return reference.moe_ffn(h, router, gate_exps, up_exps, down_exps, k, norm_weights, **opts)
    return _backend(h).moe_ffn(h, router, gate_exps, up_exps, down_exps, k, norm_weights, ctx, **opts)
