"""The operations a model is written against, dispatched on the device of the input tensor.

CPU -> minfer.ops.reference (torch float32, the reference every kernel is checked against);
CUDA -> minfer.ops.cuda (Triton), imported on first use. Signatures: docs/interfaces.md.
"""

from __future__ import annotations

from minfer.ops import reference

_cuda = None


def _backend(x):
    global _cuda
    if x.device.type != "cuda":
        return reference
    if _cuda is None:
        from minfer.weights import cuda_backend

        _cuda = cuda_backend()
    return _cuda


def linear(x, w, bias=None):
    """x (T, K) @ w (N, K)^T + bias (N,) -> (T, N)."""
    return _backend(x).linear(x, w, bias)


def linear_many(x, ws, biases):
    """The same input through several weights (q/k/v, gate/up): x (T, K) -> [(T, N_i)].

    A backend may fuse them (one scratch, one GEMM); without such a kernel each weight goes
    through linear() and the path `qmatmul.group.unfused` is counted."""
    be = _backend(x)
    fused = getattr(be, "linear_many", None)
    if fused is not None:
        return fused(x, ws, biases)
    if be is not reference:
        from minfer.ops import paths

        paths.count("qmatmul.group.unfused")
    return [be.linear(x, w, b) for w, b in zip(ws, biases)]


def embedding(ids, w):
    """ids (T,) int64 -> rows of w, (T, D)."""
    return _backend(ids).embedding(ids, w)


def rms_norm(x, weight, eps):
    """x (T, D) -> x / rms(x) * weight, (T, D)."""
    return _backend(x).rms_norm(x, weight, eps)


def add_rms_norm(x, y, weight, eps, out_dtype):
    """(s, h): s = x + y (T, D), the residual stream; h = rms_norm(s) * weight in out_dtype."""
    return _backend(x).add_rms_norm(x, y, weight, eps, out_dtype)


def rope(x, positions, cfg):
    """x (T, H, Dh), positions (T,) int64, cfg: minfer.config.RopeConfig -> (T, H, Dh)."""
    return _backend(x).rope(x, positions, cfg)


def swiglu(gate, up):
    """silu(gate) * up, (T, F)."""
    return _backend(gate).swiglu(gate, up)


def attention(q, k_cache, v_cache, start_pos):
    """q (T, H, Dh) at positions start_pos.., caches (S, Hkv, Dh) -> (T, H, Dh), causal."""
    return _backend(q).attention(q, k_cache, v_cache, start_pos)
