"""RMSNorm, rotary embedding and SwiGLU as Triton kernels (fp32 math, output in x's dtype).

Formulas are the reference's (minfer/ops/reference.py, after ggml's CPU ops).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from minfer.ops import paths, reference
from minfer.ops.context import DEFAULT, Context
from minfer.ops.cuda.pdl import enabled as pdl_enabled
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw


@triton.jit
def _rms_norm_kernel(x, w, out, D, stride_x, stride_o, eps, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    dm = d < D
    v = tl.load(x + row * stride_x + d, mask=dm, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / D + eps)
    g = tl.load(w + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(out + row * stride_o + d, (v * r * g).to(out.dtype.element_ty), mask=dm)


@triton.jit
def _add_rms_norm_kernel(x, y, w, s_out, h_out, D, stride_x, stride_y, stride_s, stride_h, eps,
                         BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    dm = d < D
    v = tl.load(x + row * stride_x + d, mask=dm, other=0.0).to(tl.float32) \
        + tl.load(y + row * stride_y + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(s_out + row * stride_s + d, v.to(s_out.dtype.element_ty), mask=dm)
    r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / D + eps)
    g = tl.load(w + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(h_out + row * stride_h + d, (v * r * g).to(h_out.dtype.element_ty), mask=dm)


class RawNorm:
    """A decode row's residual add + RMSNorm left to the raw-block GEMV group that reads it
    (Switches.gemv_raw_norm; h.raw_prenorm): s and h are allocated, not written. The group's
    one-pass launch (gemv.gemv's norm) makes h in its programs and stores s and h from program 0;
    any other consumer calls materialize(), which runs _add_rms_norm_kernel into s and h once (a
    counted fallback: qmatmul._realized)."""

    __slots__ = ("x", "y", "weight", "eps", "s", "h", "done")

    def __init__(self, x, y, weight, eps: float, s, h):
        self.x, self.y, self.weight, self.eps, self.s, self.h, self.done = x, y, weight, float(eps), s, h, False

    def materialize(self) -> None:
        if not self.done:
            _add_rms_norm_launch(self.x, self.y, self.weight, self.eps, self.s, self.h)
            self.done = True


def _add_rms_norm_launch(x, y, weight, eps: float, s, h) -> None:
    t, d = x.shape
    bd = triton.next_power_of_2(d)
    _add_rms_norm_kernel[(t,)](x, y, weight, s, h, d, x.stride(0), y.stride(0), s.stride(0), h.stride(0),
                               float(eps), BD=bd, num_warps=4 if bd <= 2048 else 8)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype,
                 ctx: Context | None = None, into_linear: bool = False, role: str = "", raw_ok: bool = False):
    """(s, h): s = x + y in x's dtype (the float32 residual), h = rms_norm(s) * weight in
    out_dtype, in one pass over the rows (one kernel instead of add + norm + cast; H200 A/B in
    docs/perf-log.md section 10). Switches.fused_add_norm=False runs the add, rms_norm and
    cast kernels it replaced, counted as switched off.

    into_linear (the caller passes h only to ops.linear / linear_many): with
    Switches.norm_into_gemv, one decode row's s and h are left to the q8 GEMV that reads h
    (h.prenorm: q8_rows.PreNorm; counted `add_rms_norm.into_gemv`); the GEMV computes them in
    its programs, or runs this kernel first where it cannot (a counted fallback). role: the call's
    name for Switches.pdl_early_sites besides the site's (pdl.enabled; attn_norm: before q/k/v).
    raw_ok (the caller passes h to ops.linear / linear_many only): with Switches.gemv_raw_norm, where
    every layer's group after this norm (role: q/k/v after attn_norm, gate/up after ffn_norm) is a
    raw-block one-pass GEMV (the workspace's raw_prenorm, set at load: gemv.raw_prenorm_roles), one
    decode row's s and h are left to that group's GEMV (h.raw_prenorm: RawNorm; counted
    `add_rms_norm.into_raw_gemv`)."""
    sw = (ctx or DEFAULT).switches
    if not sw.fused_add_norm:
        paths.switched_off("add_rms_norm.triton", "MINFER_FUSED_ADD_NORM")
        s = x + y
        return s, rms_norm(s, weight, eps).to(out_dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if y.stride(-1) != 1:
        y = y.contiguous()
    t, d = x.shape
    if (raw_ok and t == 1 and sw.gemv_raw_norm and role in getattr((ctx or DEFAULT).workspace, "raw_prenorm", ())
            and x.dtype == torch.float32 and x.is_contiguous() and y.is_contiguous()):
        paths.count("add_rms_norm.into_raw_gemv")
        s = torch.empty((1, d), dtype=torch.float32, device=x.device)
        h = torch.empty((1, d), dtype=out_dtype, device=x.device)
        h.raw_prenorm = RawNorm(x, y, weight, eps, s, h)
        return s, h
    if t == 1 and q8_row_ok(d, out_dtype, sw):
        # one decode row: also its int8 form for the q8 GEMV (q8_rows.py, gemv_q8.py), in the same launch
        from minfer.ops.cuda import q8_rows

        if into_linear and x.dtype == torch.float32 and x.is_contiguous() and y.is_contiguous():
            if 1 <= sw.norm_into_gemv <= 3:
                paths.count("add_rms_norm.into_gemv")
                s = torch.empty((1, d), dtype=torch.float32, device=x.device)
                return s, deferred_norm(x, y, weight, eps, s, out_dtype, sw)
            if sw.norm_into_gemv == 0:
                paths.switched_off("add_rms_norm.into_gemv", "MINFER_NORM_INTO_GEMV")
            # (modes 4 and 5 leave the norm to the GEMV before, not to this kernel's consumer:
            # linear_norm.linear_add_rms_norm; where that GEMV cannot, this kernel runs)

        paths.count("add_rms_norm.q8")
        s, h, q8 = q8_rows.add_rms_norm_q8(x, y, weight, eps, out_dtype, interpret=_interp(),
                                           pdl=pdl_enabled(sw, x.device, "add_rms_norm", early_ok=True, role=role),
                                           one_pass=_one_pass(sw), preload=sw.pdl_preload)
        h.q8 = q8
        return s, h
    if _q8_rows_ok(t, d, out_dtype, sw) and x.is_contiguous() and y.is_contiguous() and x.dtype == torch.float32:
        # batched decode rows for the int8 GEMM (qgemm_q8.py): their int8 form from the same launch
        from minfer.ops.cuda import q8_rows

        paths.count("add_rms_norm.q8rows")
        s, h, q8 = q8_rows._q8_launch(x, y, None, weight, eps, out_dtype, _interp(), rows_ok=True)
        h.q8 = q8
        return s, h
    paths.count("add_rms_norm.triton")
    s = torch.empty((t, d), dtype=torch.promote_types(x.dtype, y.dtype), device=x.device)
    h = torch.empty((t, d), dtype=out_dtype, device=x.device)
    _add_rms_norm_launch(x, y, weight, eps, s, h)
    return s, h


def deferred_norm(x, y, weight, eps: float, s, out_dtype, sw, ssp=None, q8u=None) -> torch.Tensor:
    """h (1, D) in out_dtype, unwritten, with h.prenorm (q8_rows.PreNorm) for the q8 GEMV that
    reads it: rms_norm(x + y) * weight, s receiving x + y (or, with ssp, y None and x the
    residual itself with its per-tile sums of squares, and q8u the q8 form of s * weight without
    rstd); its kernel, if it must run, launches as add_rms_norm's would (PDL, one pass, preload)."""
    from minfer.ops.cuda import q8_rows

    h = torch.empty((1, x.shape[1]), dtype=out_dtype, device=x.device)
    h.prenorm = q8_rows.PreNorm(x, y, weight, eps, s, h, _interp(),
                                pdl_enabled(sw, x.device, "add_rms_norm", early_ok=True), _one_pass(sw),
                                sw.pdl_preload, ssp=ssp, q8u=q8u)
    return h


def rms_norm_cast(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype, ctx: Context | None = None):
    """rms_norm(x) * weight in out_dtype; one row also gets its q8 form (q8_rows.py) in the same
    launch, else rms_norm + cast."""
    sw = (ctx or DEFAULT).switches
    if x.dim() == 2 and x.shape[0] == 1 and x.is_contiguous() and q8_row_ok(x.shape[1], out_dtype, sw):
        from minfer.ops.cuda import q8_rows

        paths.count("rms_norm.q8")
        _, h, q8 = q8_rows._q8_launch(x, None, None, weight, eps, out_dtype, _interp(),
                                      pdl=pdl_enabled(sw, x.device, "rms_norm", early_ok=True),
                                      one_pass=_one_pass(sw), preload=sw.pdl_preload)
        h.q8 = q8
        return h
    return rms_norm(x, weight, eps).to(out_dtype)


def _one_pass(sw) -> bool:
    """Switches.norm_one_pass, counted when off (the norm's sum of squares then loops)."""
    if not sw.norm_one_pass:
        paths.switched_off("rms_norm.q8.one_pass", "MINFER_NORM_ONE_PASS")
    return sw.norm_one_pass


def _interp() -> bool:
    from minfer.ops.cuda.dequant import interpret

    return interpret()


def _q8_rows_ok(t: int, d: int, dtype, sw) -> bool:
    """Whether t > 1 rows are made with their int8 form too: the batched rows the int8 GEMM takes
    (Switches.qgemm_q8, dense_gemv_max_m < t <= qgemm_max_m; qmatmul._qgemm_q8 reads x.q8)."""
    return (getattr(sw, "qgemm_q8", False) and sw.dense_gemv_max_m < t <= sw.qgemm_max_m and d % 256 == 0
            and dtype != torch.float32)


def q8_row_ok(d: int, dtype, sw) -> bool:
    """Whether a one-row activation of d values is also made in int8 form (Switches.gemv_q8):
    the repacked GEMV's K is a multiple of 256; float32 activations keep the exact path."""
    if not sw.gemv_q8:
        paths.switched_off("q8 activations", "MINFER_GEMV_Q8")
        return False
    return d % 256 == 0 and dtype != torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (T, D) -> x * rsqrt(mean(x^2) + eps) * weight, (T, D) in x's dtype."""
    paths.count("rms_norm.triton")
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, d = x.shape
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    bd = triton.next_power_of_2(d)
    _rms_norm_kernel[(t,)](x, weight, out, d, x.stride(0), out.stride(0), float(eps), BD=bd,
                           num_warps=4 if bd <= 2048 else 8)
    return out


@triton.jit
def rope_angles(p, inv_freq, j, jm, HALF: tl.constexpr, NEOX: tl.constexpr):
    """cos and sin of pair j's angle at position p, and the pair's two indices in the head (ia, ib:
    halves for neox, adjacent for normal). The angle counted in turns (inv_freq / 2pi) in float64,
    its fraction taken there, so long positions keep their precision (the reference computes
    angles in float64); cos/sin in fp32. (A Python float literal would be an fp32 constant in
    Triton: keep 2*pi out of the fp64 math.)"""
    turns = p.to(tl.float64) * tl.load(inv_freq + j, mask=jm, other=0.0)
    ang = (turns - tl.floor(turns)).to(tl.float32) * 6.283185307179586
    if NEOX:
        ia = j
        ib = j + HALF
    else:
        ia = 2 * j
        ib = 2 * j + 1
    return tl.cos(ang), tl.sin(ang), ia, ib


@triton.jit
def rope_rotate(a, b, c, s):
    """(a c - b s, a s + b c) in float32, each with its roundings fixed: the first product fused into an fma, the
    second rounded before it. Written as `a * c - b * s`, the compiler chooses which product to fuse, and two
    kernels chose differently (the raw rope epilogue and rope_kv for `a * s + b * c`: 1 ulp apart in float32, now
    and then one bf16 ulp after the cast; perf-log CC2), so every rope kernel rotates through this."""
    return tl.fma(a, c, -(b * s)), tl.fma(a, s, b * c)


@triton.jit
def _rope_kernel(x, pos, inv_freq, out, H, stride_xt, stride_xh, stride_ot, stride_oh,
                 HALF: tl.constexpr, NEOX: tl.constexpr, BH: tl.constexpr, BHALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    j = tl.arange(0, BHALF)
    jm = j < HALF
    c, s, ia, ib = rope_angles(tl.load(pos + t), inv_freq, j, jm, HALF, NEOX)
    c = c[None, :]
    s = s[None, :]
    m = (h < H)[:, None] & jm[None, :]
    xp = x + t * stride_xt + h[:, None] * stride_xh
    a = tl.load(xp + ia[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(xp + ib[None, :], mask=m, other=0.0).to(tl.float32)
    op = out + t * stride_ot + h[:, None] * stride_oh
    ra, rb = rope_rotate(a, b, c, s)
    tl.store(op + ia[None, :], ra.to(out.dtype.element_ty), mask=m)
    tl.store(op + ib[None, :], rb.to(out.dtype.element_ty), mask=m)


@functools.lru_cache(maxsize=32)
def _turns(cfg, device: str) -> torch.Tensor:
    """(n_rot/2,) float64 on the device: turns per position, the reference's inverse frequencies
    (minfer.ops.reference.inv_freq, the one definition) over 2 pi. A memo of a constant."""
    return (reference.inv_freq(cfg) / (2 * math.pi)).to(device)


def rope(x: torch.Tensor, positions: torch.Tensor, cfg) -> torch.Tensor:
    """x (T, H, Dh) at positions (T,) int64 -> (T, H, Dh), rotated by cfg's convention."""
    t, h, dh = x.shape
    if cfg.style not in ("normal", "neox"):
        raise ValueError(f"unknown rope style {cfg.style!r}")
    neox, n_rot = cfg.style == "neox", cfg.n_rot
    paths.count("rope.triton")
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((t, h, dh), dtype=x.dtype, device=x.device)
    if n_rot < dh:
        out[..., n_rot:] = x[..., n_rot:]
    inv = _turns(cfg, str(x.device))
    half = n_rot // 2
    bh = min(triton.next_power_of_2(h), 16)
    _rope_kernel[(t, triton.cdiv(h, bh))](x, positions, inv, out, h, x.stride(0), x.stride(1),
                                          out.stride(0), out.stride(1), HALF=half, NEOX=neox, BH=bh,
                                          BHALF=triton.next_power_of_2(half), num_warps=4)
    return out


@triton.jit
def _rope_kv_kernel(q, k, v, pos, rows, inv_freq, q_out, kc, vc, H, HKV, sqt, sqh, skt, skh, svt, svh, sot, soh,
                    skp, skh2, svp, svh2, HALF: tl.constexpr, NEOX: tl.constexpr, BH: tl.constexpr,
                    BHALF: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr):
    """Heads [0, H) of q rotated to q_out; heads [H, H + HKV) of k rotated into the key cache at
    row pos[t] (ROWS: rows[t], a paged cache's slot); heads past that (v) copied into the value
    cache there. One launch for what rope(q), rope(k) and the two cache writes did in four.
    PDL: see pdl.py."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)
    j = tl.arange(0, BHALF)
    jm = j < HALF
    p = tl.load(pos + t)
    cs, sn, ia, ib = rope_angles(p, inv_freq, j, jm, HALF, NEOX)
    if ROWS:
        r = tl.load(rows + t)
    else:
        r = p
    is_q = hh < H
    is_k = (hh >= H) & (hh < H + HKV)
    hk = tl.where(is_k, hh - H, 0)
    hv = tl.where(hh >= H + HKV, hh - H - HKV, 0)
    rot = (is_q | is_k)[:, None]
    c = tl.where(rot, cs[None, :], 1.0)
    s = tl.where(rot, sn[None, :], 0.0)
    m = (hh < H + 2 * HKV)[:, None] & jm[None, :]
    src = tl.where(is_q, q + t * sqt + hh * sqh, tl.where(is_k, k + t * skt + hk * skh, v + t * svt + hv * svh))
    dst = tl.where(is_q, q_out + t * sot + hh * soh, tl.where(is_k, kc + r * skp + hk * skh2, vc + r * svp + hv * svh2))
    a = tl.load(src[:, None] + ia[None, :], mask=m, other=0.0).to(tl.float32)
    b = tl.load(src[:, None] + ib[None, :], mask=m, other=0.0).to(tl.float32)
    ra, rb = rope_rotate(a, b, c, s)
    tl.store(dst[:, None] + ia[None, :], ra.to(q_out.dtype.element_ty), mask=m)
    tl.store(dst[:, None] + ib[None, :], rb.to(q_out.dtype.element_ty), mask=m)


def rope_kv_write(q, k, v, positions, cfg, k_cache, v_cache, pdl: int = 0, rows=None, q_out=None):
    """q rotated (returned, (T, H, Dh)); k rotated and v stored at rows `positions` (or `rows`,
    (T,) int64: a paged cache's slots) of the caches (S, Hkv, Dh), in one launch. Caller's
    conditions: every head dim rotated (n_rot == Dh), one dtype for q/k/v/caches, rows in range
    (no host check here: graph replays). q_out: where rope(q) goes (may be q itself), else a new tensor."""
    t, h, dh = q.shape
    hkv = k.shape[1]
    paths.count("rope_kv.triton")
    out = q_out if q_out is not None else torch.empty((t, h, dh), dtype=q.dtype, device=q.device)
    inv = _turns(cfg, str(q.device))
    half = cfg.n_rot // 2
    bh = 8
    _rope_kv_kernel[(t, triton.cdiv(h + 2 * hkv, bh))](
        q, k, v, positions, positions if rows is None else rows, inv, out, k_cache, v_cache, h, hkv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), HALF=half, NEOX=cfg.style == "neox", BH=bh,
        BHALF=triton.next_power_of_2(half), PDL=pdl, ROWS=rows is not None, num_warps=4,
        **launch_kw(pdl))
    return out


@triton.jit
def _swiglu_kernel(g, u, out, n, F, sg, su, BLOCK: tl.constexpr):
    """out (T, F) contiguous; g, u rows of F values at row strides sg, su (column views of one
    group GEMM's output, qmatmul.linear_many)."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    r = o // F
    c = o - r * F
    a = tl.load(g + r * sg + c, mask=m, other=0.0).to(tl.float32)
    b = tl.load(u + r * su + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out + o, (a / (1.0 + tl.exp(-a)) * b).to(out.dtype.element_ty), mask=m)


@triton.jit
def _geglu_kernel(g, u, out, n, BLOCK: tl.constexpr):
    # gelu_tanh(a) = 0.5 a (1 + tanh(c)) = a * sigmoid(2c), c = sqrt(2/pi) (a + 0.044715 a^3)
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    a = tl.load(g + o, mask=m, other=0.0).to(tl.float32)
    b = tl.load(u + o, mask=m, other=0.0).to(tl.float32)
    c = 0.7978845608028654 * (a + 0.044715 * a * a * a)
    tl.store(out + o, (a / (1.0 + tl.exp(-2.0 * c)) * b).to(out.dtype.element_ty), mask=m)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up, (T, F) in gate's dtype (reference.geglu)."""
    paths.count("geglu.triton")
    gate = gate.contiguous()
    up = up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    block = 1024
    _geglu_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block, num_warps=4)
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor, ctx: Context | None = None, into_linear: bool = False,
           down=None) -> torch.Tensor:
    """silu(gate) * up, (T, F) in gate's dtype. One row (decode) also gets its int8 form
    (`.q8`, for the down projection's q8 GEMV) from the same launch. into_linear (the caller passes
    the result to ops.linear / linear_add_rms_norm only): with Switches.gemv_glu_prologue, one row is
    left to the down GEMV (h.glu_row: q8_rows.GluRow; counted `swiglu.into_gemv`) -- at 1 not where
    that GEMV (down: its weight) runs on the Gluon kernel (qmatmul.glu_on_gluon; perf-log AY0)."""
    sw = (ctx or DEFAULT).switches
    if gate.shape[0] == 1 and q8_row_ok(gate.shape[1], gate.dtype, sw):
        from minfer.ops.cuda import q8_rows

        def pdl() -> int:        # (counted `pdl.swiglu` only where the swiglu kernel launches)
            return pdl_enabled(sw, gate.device, "swiglu", early_ok=True)

        from minfer.ops.cuda.qmatmul import glu_on_gluon

        if into_linear and sw.gemv_glu_prologue and gate.is_contiguous() and up.is_contiguous() and (
                down is None or sw.gemv_glu_prologue >= 2 or not glu_on_gluon(gate, down, sw)):
            paths.count("swiglu.into_gemv")
            h = torch.empty_like(gate)
            h.glu_row = q8_rows.GluRow(gate, up, h, _interp(), pdl)
            return h
        paths.count("swiglu.q8")
        h, q8 = q8_rows.swiglu_q8(gate.contiguous(), up.contiguous(), interpret=_interp(), pdl=pdl())   # dense rows
        h.q8 = q8
        return h
    if _q8_rows_ok(gate.shape[0], gate.shape[1], gate.dtype, sw):
        from minfer.ops.cuda import q8_rows

        paths.count("swiglu.q8rows")
        h, q8 = q8_rows.swiglu_q8_rows(gate.contiguous(), up.contiguous(), interpret=_interp())
        h.q8 = q8
        return h
    paths.count("swiglu.triton")
    if gate.stride(-1) != 1 or up.stride(-1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    t, f = gate.shape
    out = torch.empty((t, f), dtype=gate.dtype, device=gate.device)
    n = t * f
    block = 1024
    _swiglu_kernel[(triton.cdiv(n, block),)](gate, up, out, n, f, gate.stride(0), up.stride(0), BLOCK=block,
                                            num_warps=4)
    return out

