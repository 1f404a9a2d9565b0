"""The operations a model is written against, dispatched on the device of the input tensor.

CPU -> minfer.ops.reference (torch float32, the reference every kernel is checked against);
CUDA -> minfer.ops.cuda (Triton), imported on first use. Signatures: docs/interfaces.md.

`ctx` (minfer.ops.context.Context: the engine's switches and workspace) is passed to the ops
whose CUDA version has a fast path to switch or buffers to use; the reference ignores it.
ops/ imports nothing from runtime/, models/, bench/ or commands/ (tests/test_imports.py).
"""

from __future__ import annotations

from minfer.ops import reference
from minfer.ops.context import Context

__all__ = ["Context", "LENGTH_BUCKET", "linear", "linear_many", "embedding", "rms_norm", "add_rms_norm",
           "rope", "swiglu", "attention"]

# Prefill attention on CUDA rounds its length up to a multiple of this (one cuDNN plan per
# bucket, docs/perf-log.md section 10), so the KV cache has rows up to the next multiple past
# the context, and prefill CUDA graphs pad prompts to it. Defined here once.
LENGTH_BUCKET = 128


def _backend(x):
    if x.device.type != "cuda":
        return reference
    from minfer.device import cuda_backend

    return cuda_backend()


def linear(x, w, bias=None, ctx: Context | None = None):
    """x (T, K) @ w (N, K)^T + bias (N,) -> (T, N)."""
    if x.device.type != "cuda":
        return reference.linear(x, w, bias)
    return _backend(x).linear(x, w, bias, ctx)


def linear_many(x, ws, biases, ctx: Context | None = None):
    """The same input through several weights (q/k/v): x (T, K) -> [(T, N_i)].

    On CUDA a group the model declared (Model.linear_groups) goes through one scratch and one
    GEMM; the reference runs each weight through linear()."""
    if x.device.type != "cuda":
        return [reference.linear(x, w, b) for w, b in zip(ws, biases)]
    return _backend(x).linear_many(x, ws, biases, ctx)


def embedding(ids, w):
    """ids (T,) int64 -> rows of w, (T, D) float32."""
    return _backend(ids).embedding(ids, w)


def rms_norm(x, weight, eps):
    """x (T, D) -> x / rms(x) * weight, (T, D)."""
    return _backend(x).rms_norm(x, weight, eps)


def add_rms_norm(x, y, weight, eps, out_dtype, ctx: Context | None = None):
    """(s, h): s = x + y (T, D), the residual stream; h = rms_norm(s) * weight in out_dtype."""
    if x.device.type != "cuda":
        return reference.add_rms_norm(x, y, weight, eps, out_dtype)
    return _backend(x).add_rms_norm(x, y, weight, eps, out_dtype, ctx)


def rope(x, positions, cfg):
    """x (T, H, Dh), positions (T,) int64, cfg: minfer.config.RopeConfig -> (T, H, Dh)."""
    return _backend(x).rope(x, positions, cfg)


def swiglu(gate, up):
    """silu(gate) * up, (T, F)."""
    return _backend(gate).swiglu(gate, up)


def attention(q, k_cache, v_cache, start_pos, ctx: Context | None = None):
    """q (T, H, Dh) at positions start_pos.., caches (S, Hkv, Dh) -> (T, H, Dh), causal.
    start_pos: an int, or a (1,) int64 device tensor (decode under a CUDA graph)."""
    if q.device.type != "cuda":
        return reference.attention(q, k_cache, v_cache, start_pos)
    return _backend(q).attention(q, k_cache, v_cache, start_pos, ctx)
