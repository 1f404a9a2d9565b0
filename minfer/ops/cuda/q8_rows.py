"""The one-row int8 activation form of the q8 decode GEMV (gemv_q8.py) and its producers
(issue 12): the activation row is quantized once, when it is produced, as llama.cpp's mmvq
quantizes to Q8_1 once per step.

Activation form ("q8", made by the kernels below for one row of K values):
  xq int32 (K/32 * 8,): chunk c of 32 values is 8 words, matched to the planes' word layout
     (nibble p of word w is value 4p + w, gemv_repack_layout.py): word w (0..3) holds values
     w, w+8, w+16, w+24 as signed bytes (the low nibbles of weight word w), word 4 + w holds
     w+4, w+12, w+20, w+28 (its high nibbles).
  xf float32 (K/32 * 4,): per chunk (d, s0, s1, 0): values x = d * q, q in -127..127
     (d = max|x| / 127, rounded half away from zero, llama.cpp's quantize_row_q8_1 rule),
     s0 / s1 = d * (sum of q over values 0..15 / 16..31) for the weights' min and -32 terms.

Producers (one launch each, replacing the kernel that made the bf16 row): `add_rms_norm_q8`
(residual add + RMSNorm + quantize; every program recomputes the row's rstd, the row is tiny),
`swiglu_q8` (the down projection's input), `quantize` (any row). Each also writes the bf16
row, so a consumer without this path still has its input.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw


@triton.jit
def _q8_quant(v):
    """The q8 form of a [CB, 32] fp32 tile: (words [CB, 8] int32, d, s0, s1 [CB] fp32)."""
    CB: tl.constexpr = v.shape[0]
    amax = tl.max(tl.abs(v), axis=1)                                   # [CB]
    d = amax / 127.0
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    t = v * inv[:, None]
    q = (t + tl.where(t >= 0, 0.5, -0.5)).to(tl.int32)                 # half away from zero
    i = tl.arange(0, 32)
    s0 = tl.sum(tl.where((i < 16)[None, :], q, 0), axis=1).to(tl.float32) * d
    s1 = tl.sum(tl.where((i >= 16)[None, :], q, 0), axis=1).to(tl.float32) * d
    # value i = 8b + 4h + w -> byte b of word 4h + w (disjoint bit fields: the sum is an OR)
    q4 = tl.reshape(q & 255, (CB, 4, 8))                               # [c, b, 4h + w]
    sh = (tl.arange(0, 4) * 8)[None, :, None]
    words = tl.sum(q4 << sh, axis=1)                                   # [CB, 8]
    return words, d, s0, s1


@triton.jit
def _q8_chunks(v, c, cmask, xq, xf):
    """Quantize a [CB, 32] fp32 tile (chunks c) and store its words and (d, s0, s1, 0)."""
    words, d, s0, s1 = _q8_quant(v)
    j = tl.arange(0, 8)
    tl.store(xq + c[:, None] * 8 + j[None, :], words, mask=cmask[:, None])
    f = tl.arange(0, 4)[None, :]
    vals = tl.where(f == 0, d[:, None], tl.where(f == 1, s0[:, None], tl.where(f == 2, s1[:, None], 0.0)))
    tl.store(xf + c[:, None] * 4 + f, vals, mask=cmask[:, None])


@triton.jit
def _glu_q8_words(g, u, kc, kmask):
    """The q8 form of chunks kc [C] of silu(g) * u (g, u: one row each, in the activations' dtype),
    made as swiglu_q8 makes it (its formula in float32, then _q8_quant): (lo words [C, 4] -- words
    0-3 of each chunk --, hi words [C, 4], d, s0, s1 [C]), for the q8 GEMV's GLU prologue; masked
    chunks come out zero."""
    C: tl.constexpr = kc.shape[0]
    k = kc[:, None] * 32 + tl.arange(0, 32)[None, :]
    a = tl.load(g + k, mask=kmask[:, None], other=0.0).to(tl.float32)
    b = tl.load(u + k, mask=kmask[:, None], other=0.0).to(tl.float32)
    words, d, s0, s1 = _q8_quant(a / (1.0 + tl.exp(-a)) * b)
    lo, hi = tl.split(tl.permute(tl.reshape(words, (C, 2, 4)), (0, 2, 1)))   # word 4h + w -> [c, w] of h
    return lo, hi, d, s0, s1


@triton.jit
def _q8_kernel(x, y, up, nw, s_out, h_out, xq, xf, K, eps,
               ADD: tl.constexpr, NORM: tl.constexpr, SWIGLU: tl.constexpr, CB: tl.constexpr,
               BK: tl.constexpr, PDL: tl.constexpr, PRE: tl.constexpr = False):
    """Row program_id(1) (rows contiguous, K apart): v = x (+ y) [silu(x) * up]; [rms_norm(v) *
    nw]; chunks CB*pid.. quantized. PDL: launched early, waits for the previous kernel (pdl.py);
    PRE: the norm weight (no kernel writes it) is loaded before that wait (Switches.pdl_preload)."""
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    cmask = c < K // 32
    k = c[:, None] * 32 + tl.arange(0, 32)[None, :]
    km = cmask[:, None]
    if NORM and PRE:
        g = tl.load(nw + k, mask=km, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    row = tl.program_id(1).to(tl.int64)
    x += row * K
    y += row * K
    up += row * K
    s_out += row * K
    h_out += row * K
    xq += row * (K // 4)
    xf += row * (K // 8)
    v = tl.load(x + k, mask=km, other=0.0).to(tl.float32)
    if ADD:
        v += tl.load(y + k, mask=km, other=0.0).to(tl.float32)
        tl.store(s_out + k, v, mask=km)
    if SWIGLU:
        u = tl.load(up + k, mask=km, other=0.0).to(tl.float32)
        v = v / (1.0 + tl.exp(-v)) * u
    if NORM:
        ss = tl.zeros([BK], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + tl.arange(0, BK)
            a = tl.load(x + kk, mask=kk < K, other=0.0).to(tl.float32)
            if ADD:
                a += tl.load(y + kk, mask=kk < K, other=0.0).to(tl.float32)
            ss += a * a
        r = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        if not PRE:
            g = tl.load(nw + k, mask=km, other=0.0).to(tl.float32)
        v = v * r * g
    tl.store(h_out + k, v.to(h_out.dtype.element_ty), mask=km)
    _q8_chunks(v, c, cmask, xq, xf)


def _norm_block(k: int, interpret: bool, one_pass: bool) -> int:
    """The norm's sum-of-squares block: the whole row in one load round when one_pass (a row of
    up to 8192 values; each program needs the row's sum before it scales its chunks, and a loop
    of 1024-value rounds costs one L2 round trip per round: ~2 us of the kernel's ~4 us in the
    graphed 7B step, perf-log V1), else rounds of 1024 (256 in the interpreter, which then
    tests the loop)."""
    if interpret:
        return 256
    if one_pass and k <= 8192:
        return triton.next_power_of_2(k)
    return 1024


def _q8_launch(x, y, up, nw, eps, out_dtype, interpret, rows_ok: bool = False, pdl: bool = False,
               one_pass: bool = True, preload: bool = True, s_out=None, h_out=None):
    if (x.dim() != 2 or (x.shape[0] != 1 and not rows_ok) or x.shape[1] % 256 or not x.is_contiguous()
            or any(t is not None and (t.shape != x.shape or not t.is_contiguous()) for t in (y, up))):
        raise MinferError(f"gemv_q8: expected one contiguous row of a multiple of 256 values, got "
                          f"{tuple(x.shape)} strides {x.stride()}")
    if up is not None and nw is not None:
        raise MinferError("gemv_q8: SwiGLU and RMSNorm in one launch are not supported (the norm's sum reads x)")
    r, k = x.shape
    dev = x.device
    xq = torch.empty((r, k // 4), dtype=torch.int32, device=dev)
    xf = torch.empty((r, k // 8), dtype=torch.float32, device=dev)
    h = h_out if h_out is not None else torch.empty((r, k), dtype=out_dtype, device=dev)
    s = (s_out if s_out is not None else torch.empty((r, k), dtype=torch.float32, device=dev)) if y is not None else h
    cb = 4 if interpret else 16
    if r == 1:
        xq, xf = xq.view(-1), xf.view(-1)
    _q8_kernel[(triton.cdiv(k // 32, cb), r)](
        x, y if y is not None else x, up if up is not None else x, nw if nw is not None else x, s, h, xq, xf,
        k, float(eps), ADD=y is not None, NORM=nw is not None, SWIGLU=up is not None, CB=cb,
        BK=_norm_block(k, interpret, one_pass), PDL=pdl, PRE=bool(preload and nw is not None),
        num_warps=4, **launch_kw(pdl))
    return s, h, (xq, xf)


def quantize(x: torch.Tensor, interpret: bool = False) -> tuple:
    """x (1, K) -> (xq, xf), the q8 form (module doc)."""
    return _q8_launch(x, None, None, None, 0.0, x.dtype, interpret)[2]


def add_rms_norm_q8(x, y, weight, eps: float, out_dtype, interpret: bool = False, pdl: bool = False,
                    one_pass: bool = True, preload: bool = True):
    """(s, h, q8): s = x + y (float32), h = rms_norm(s) * weight in out_dtype, q8 = h's q8 form
    quantized from the float32 value (not from h's rounding). pdl: programmatic launch (pdl.py);
    one_pass: the row's sum of squares in one load round (_norm_block); preload: with pdl, the
    norm weight is loaded before the PDL wait (Switches.pdl_preload)."""
    return _q8_launch(x, y, None, weight, eps, out_dtype, interpret, pdl=pdl, one_pass=one_pass, preload=preload)


class PreNorm:
    """A decode row's residual add + RMSNorm + q8 left to the q8 GEMV that reads it
    (Switches.norm_into_gemv; norm_rope_act.add_rms_norm with into_linear): s (float32) and h
    (out_dtype) are allocated, not written; the Gluon GEMV's NORM programs compute the q8 row
    from x + y themselves and one of them stores s (gemv_q8_gluon._tile). Any other consumer
    calls materialize(), which runs add_rms_norm_q8's kernel into s and h (once) and attaches
    the q8 form to h, as the add_rms_norm path without the deferral does."""

    __slots__ = ("x", "y", "weight", "eps", "s", "h", "interpret", "pdl", "one_pass", "preload", "q8", "ssp", "q8u")

    def __init__(self, x, y, weight, eps: float, s, h, interpret: bool, pdl: int, one_pass: bool, preload: bool,
                 ssp=None, q8u=None):
        self.x, self.y, self.weight, self.eps, self.s, self.h = x, y, weight, float(eps), s, h
        self.interpret, self.pdl, self.one_pass, self.preload = interpret, pdl, one_pass, preload
        self.q8 = None
        # ssp: the residual's per-tile sums of squares (gemv_q8.gemv_q8_residual): x is then the
        # residual s itself (written by that GEMV) and y is None
        self.ssp = ssp
        # q8u (with ssp): the q8 form of s * weight without rstd, made by that GEMV's tiles
        # (Switches.norm_into_gemv = 4): a q8 GEMV reads it and scales its row sums by rstd
        self.q8u = q8u

    def materialize(self) -> tuple:
        """(xq, xf) of h; the kernel runs on the first call (writing s and h; with ssp, h only)."""
        if self.q8 is None:
            if self.y is None:
                _, _, self.q8 = _q8_launch(self.x, None, None, self.weight, self.eps, self.h.dtype, self.interpret,
                                           pdl=self.pdl, one_pass=self.one_pass, preload=self.preload, h_out=self.h)
            else:
                _, _, self.q8 = _q8_launch(self.x, self.y, None, self.weight, self.eps, self.h.dtype,
                                           self.interpret, pdl=self.pdl, one_pass=self.one_pass,
                                           preload=self.preload, s_out=self.s, h_out=self.h)
            self.h.q8 = self.q8
        return self.q8


def swiglu_q8(gate, up, interpret: bool = False, pdl: bool = False, h_out=None):
    """(h, q8): h = silu(gate) * up in gate's dtype (into h_out when given), and its q8 form (from
    the float32 value)."""
    if up.shape != gate.shape or up.stride() != gate.stride():
        raise MinferError(f"gemv_q8: up {tuple(up.shape)} does not match gate {tuple(gate.shape)}")
    _, h, q8 = _q8_launch(gate, None, up, None, 0.0, gate.dtype, interpret, pdl=pdl, h_out=h_out)
    return h, q8


class GluRow:
    """A decode row's silu(gate) * up and its q8 form left to the down projection's q8 GEMV
    (Switches.gemv_glu_prologue; norm_rope_act.swiglu with into_linear; h.glu_row): h is allocated,
    not written. The GEMV's GLU prologue (gemv_q8(glu=(gate, up))) makes x_hat in its programs;
    any other consumer calls materialize(), which runs swiglu_q8 into h once and attaches the q8
    form to h (a counted fallback: qmatmul). pdl: a callable giving that launch's PDL mode, asked
    only when it runs (pdl.enabled counts the site)."""

    __slots__ = ("gate", "up", "h", "interpret", "pdl", "done")

    def __init__(self, gate, up, h, interpret: bool, pdl):
        self.gate, self.up, self.h, self.interpret, self.pdl, self.done = gate, up, h, interpret, pdl, False

    def materialize(self) -> None:
        if not self.done:
            _, self.h.q8 = swiglu_q8(self.gate, self.up, interpret=self.interpret, pdl=self.pdl(), h_out=self.h)
            self.done = True


def quantize_rows(x: torch.Tensor, interpret: bool = False) -> tuple:
    """x (R, K) -> (xq (R, K/4), xf (R, K/8)): each row's q8 form (module doc)."""
    q = _q8_launch(x.contiguous(), None, None, None, 0.0, x.dtype, interpret, rows_ok=True)[2]
    return (q[0].view(x.shape[0], -1), q[1].view(x.shape[0], -1))


def swiglu_q8_rows(gate, up, interpret: bool = False):
    """(h, q8) for R rows: h = silu(gate) * up (R, F), q8 = (xq (R, F/4), xf (R, F/8)), row r's
    int8 form in row r (the MoE down projection's per-expert inputs)."""
    _, h, q8 = _q8_launch(gate.contiguous(), None, up.contiguous(), None, 0.0, gate.dtype, interpret, rows_ok=True)
    return h, q8


def dequantize_q8(q8, k: int) -> torch.Tensor:
    """The x_hat (1, K) float32 a q8 form stands for (tests, and the reference of the GEMV)."""
    xq, xf = q8
    b = xq.view(-1, 8).view(torch.int8).view(-1, 8, 4).to(torch.float32)    # [c, 4h + w, byte b]
    vals = b.permute(0, 2, 1).reshape(-1, 32)                               # [c, 8b + 4h + w]
    return (vals * xf.view(-1, 4)[:, :1]).reshape(1, k)


# ---------------------------------------------------------------- the GEMV
