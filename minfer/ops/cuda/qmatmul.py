"""linear() on CUDA: choose between the decode GEMV and dequantize-to-scratch + cuBLAS.

- M <= Switches.gemv_max_m (32: on the H200 the GEMV beat dequant+cuBLAS up to M=32 on the
  qkv and gate shapes, docs/perf-log.md section 4): gemv.gemv reads the raw blocks once.
- larger M (prefill): the layer's blocks are decoded into a scratch of the activation dtype by
  dequant.dequantize_into (memory-bound, ~N*K*2 bytes written) and torch.matmul (cuBLAS) does
  the math (ANCHORS.md: 49k tok/s of linear work for the 7B at M=3354).
- A weight whose dtype already equals the activations' (BF16 file tensor, bf16 activations)
  is used in place by cuBLAS: no copy.
The single scratch holds at most Switches.scratch_mb; larger weights (the 7B's lm head) are
decoded and multiplied in row chunks that fit.

Prefill groups and prefetch (docs/perf-log.md section 7), each with its off-switch:
- linear_many (Switches.fuse_groups): a group the model declared (Model.linear_groups: q/k/v)
  is dequantized into consecutive rows of one buffer and multiplied by ONE GEMM; the outputs
  are column views (the model views q/k/v as (T, H, Dh); rope and the KV cache take strides).
  Weights passed together that form no declared group go one by one.
- prefetch (Switches.prefetch): two buffers, the next group dequantized on a side stream during
  this group's GEMM (prefetch.py; counted `prefetch.hit` / `prefetch.miss`).
- biases are converted to the activation dtype once per workspace and go into cuBLAS as addmm.

Buffers, the prefetch runner and the bias cache belong to the engine's Workspace, passed in the
ops context (minfer.ops.context.Context); nothing here is module state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.context import DEFAULT, Context
from minfer.ops.cuda import dequant, gemv, gemv_q8, gemv_repack, qgemm_q8, qgemm_repack
from minfer.ops.cuda.dequant import interpret
from minfer.ops.cuda.gemv_q8g_table import table_arg
from minfer.ops.cuda.pdl import enabled as pdl_enabled
from minfer.ops.cuda.workspace import Workspace


def _q8_kw(sw, x, late: bool = False, glu: bool = False) -> dict:
    """The q8 GEMV's launch mode (ops/cuda/pdl.py), with PDL on its weight tiles read before the
    wait, what it fetches into L2 for the GEMVs after it (ops/cuda/l2_prefetch.py; off at
    Switches.l2_prefetch_mb = 0), and whether the shapes of the Gluon kernel's table take it
    (ops/cuda/gemv_q8_gluon.py, Switches.gemv_q8_gluon). late: the launch is followed directly by
    a heavy kernel; Switches.pdl_late 1 has such launches signal it at their end, 2 every launch.
    glu: for gemv_q8_swiglu, which has no bias to load before the wait (Switches.pdl_preload)."""
    mode = pdl_enabled(sw, x.device, "gemv_q8")
    l2 = None
    if sw.l2_prefetch_mb > 0 or sw.l2_big_next:
        l2 = (sw.l2_prefetch_mb << 20, sw.l2_small_mb << 20, sw.l2_big_next)
    kw = {"pdl": mode, "pdl_prefetch": sw.pdl_prefetch if mode else 1, "l2": l2, "gluon": sw.gemv_q8_gluon,
          "gluon_table": table_arg(sw), "pdl_late": bool(mode and (sw.pdl_late >= 2 or (late and sw.pdl_late >= 1))),
          "l2_heads": -sw.l2_heads if sw.l2_heads_late else sw.l2_heads}     # (gemv_q8._l2_heads: < 0 late)
    if not glu:
        kw["preload"] = sw.pdl_preload
        kw["rstd_late"] = sw.norm_rstd_late
        kw["split_gather"] = sw.split_gather
    return kw


def _ctx(ctx: Context | None, device) -> tuple:
    """(switches, workspace) of the call: a workspace of its own when the context has none."""
    ctx = ctx or DEFAULT
    ws = ctx.workspace if ctx.workspace is not None else Workspace(device)
    return ctx.switches, ws


def _float_view(w):
    """The weight as a dense (N, K) tensor viewing the raw bytes, for F32/F16/BF16 files."""
    dt = {dequant.F32: torch.float32, dequant.F16: torch.float16, dequant.BF16: torch.bfloat16}[w.qtype]
    return w.raw.view(dt).view(w.shape[0], w.shape[1])


def check_supported(w) -> None:
    if w.qtype not in dequant.LAYOUT:
        from minfer.quants import type_name
        raise MinferError(f"tensor '{w.name}': ggml type {type_name(w.qtype)} has no CUDA kernel in minfer "
                          f"(supported on cuda: {', '.join(v[0] for v in dequant.LAYOUT.values())}); "
                          f"use --device cpu")


def dequantize_weight(w, out, r0: int = 0, r1: int | None = None, interp: bool = False) -> None:
    """Rows r0..r1 of w decoded into out (r1 - r0, >= K): from the repacked planes when the
    weight has them (gemv_repack.py; they replaced its raw blocks), else from the raw blocks."""
    r1 = w.shape[0] if r1 is None else r1
    rw = gemv_repack.planes_of(w)
    if rw is not None:
        gemv_repack.dequantize_into(rw if (r0, r1) == (0, w.shape[0]) else rw.rows(r0, r1), out, interpret=interp)
    else:
        dequant.dequantize_into(w.raw[r0:r1], w.qtype, r1 - r0, w.shape[1], out, interpret=interp)


def _dequant_fn(interp):
    def f(w, out):                       # out: (n, k) rows of a scratch buffer
        dequantize_weight(w, out, interp=interp)
    return f


def _chunked(x, w, bias, scratch_1d):
    """Dequantize (in row chunks that fit `scratch_1d`) and multiply with cuBLAS. (T, N)."""
    n, k = w.shape
    dtype = x.dtype
    interp = interpret()
    rows = max(1, min(n, scratch_1d.numel() // k))
    if rows < n:
        # a whole number of 64-row groups per chunk keeps cuBLAS on its good tile sizes
        rows = max(64, rows // 64 * 64) if n >= 64 else n
    if rows >= n:
        wd = scratch_1d[: n * k].view(n, k)
        dequantize_weight(w, wd, interp=interp)
        return F.linear(x, wd, bias)
    out = torch.empty((x.shape[0], n), dtype=dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        wd = scratch_1d[: (r1 - r0) * k].view(r1 - r0, k)
        dequantize_weight(w, wd, r0, r1, interp=interp)
        torch.matmul(x, wd.t(), out=out[:, r0:r1])
    if bias is not None:
        out += bias
    return out


def _prefill(x, w, bias, tname, sw, ws):
    """The single-scratch path (prefetch and groups both off, or a float weight used in place)."""
    n, k = w.shape
    dtype = x.dtype
    if w.qtype in dequant.FLOAT_TYPES and _float_view(w).dtype == dtype:
        paths.count(f"qmatmul.{tname}.cublas_direct")
        return F.linear(x, _float_view(w), ws.group_bias((w,), (bias,), dtype))
    paths.count(f"qmatmul.{tname}.prefill")
    limit = ws.scratch_limit_elems(dtype, sw)
    rows = max(1, min(n, limit // k))
    if rows < n:
        rows = max(64, rows // 64 * 64) if n >= 64 else n
    scratch = ws.scratch(rows * k, dtype, sw)
    return _chunked(x, w, ws.group_bias((w,), (bias,), dtype), scratch[: rows * k])


def run_group(x, wts, biases, path: str, sw, ws):
    """Prefill through the double-buffered group scratch: x (T, K) -> [(T, N_i)].

    One weight alone is a group of one. The group's rows go into one buffer (prefetched on the
    side stream when predicted); a group larger than a buffer is done weight by weight in
    row chunks through one buffer used as a plain scratch. A group of several weights is
    multiplied by one GEMM over the buffer (outputs are column views: docs/perf-log.md
    section 7 decided this for q/k/v, the only declared group)."""
    dtype = x.dtype
    r = ws.runner(dtype, sw)
    k = wts[0].shape[1]
    total = sum(w.shape[0] for w in wts) * k
    limit = ws.buffer_limit_elems(dtype, sw)
    pf = sw.prefetch
    if not pf:
        paths.switched_off("prefetch", "MINFER_PREFETCH")
    deq = _dequant_fn(interpret())

    def fits(g):
        return sum(w.shape[0] for w in g) * g[0].shape[1] <= limit

    paths.count(path)
    if total > limit:
        b, buf = r.plain_scratch(wts, pf, 1 << 20)    # whatever the buffers hold (>= 1 Mi values)
        outs = [_chunked(x, w, ws.group_bias((w,), (bi,), dtype), buf) for w, bi in zip(wts, biases)]
        _release(r, b, deq, fits, pf)
        return outs
    b = r.acquire(wts, total, deq, pf)
    buf = r.bufs[b]
    wd = buf[:total].view(total // k, k)
    out = F.linear(x, wd, ws.group_bias(wts, biases, dtype))     # addmm when biased
    outs = [out] if len(wts) == 1 else list(torch.split(out, [w.shape[0] for w in wts], dim=1))
    _release(r, b, deq, fits, pf)
    return outs


def _release(r, b, deq, fits, pf):
    if pf:
        r.release(b, deq, fits)          # marks b free for the side stream, prefetches the next group
    else:
        r.release_no_prefetch(b)


def _check(x, w):
    check_supported(w)
    if x.shape[-1] != w.shape[1]:
        raise MinferError(f"tensor '{w.name}': input has {x.shape[-1]} features, the weight expects {w.shape[1]}")


def _realized(x: torch.Tensor, why: str, glu_ok: bool = False) -> torch.Tensor:
    """x itself, its deferred norm (x.prenorm / x.raw_prenorm: norm_rope_act.add_rms_norm's into_linear /
    raw_ok) or SwiGLU (x.glu_row, unless glu_ok: _linear decides) run first when this consumer cannot do it
    (a counted fallback of `add_rms_norm.into_gemv` / `add_rms_norm.into_raw_gemv` / `swiglu.into_gemv`)."""
    glu = getattr(x, "glu_row", None)
    if glu is not None and not glu.done and not glu_ok:
        paths.fallback("swiglu.into_gemv", why)
        glu.materialize()
    pre = getattr(x, "prenorm", None)
    if pre is not None and pre.q8 is None:
        paths.fallback("add_rms_norm.into_gemv", why)
        pre.materialize()
    raw = getattr(x, "raw_prenorm", None)
    if raw is not None and not raw.done:
        paths.fallback("add_rms_norm.into_raw_gemv", why)
        raw.materialize()
    return x


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None, ctx: Context | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x (T, K) @ W (N, K)^T + bias (N,) -> (T, N) in out_dtype (None: x's dtype). The one-row
    q8 GEMV stores out_dtype itself (the lm head's float32 logits: no conversion launch after
    it); the other paths convert their result."""
    _check(x, w)
    _realized(x, "a single weight's linear (only the q/k/v group's GEMV takes the norm)", glu_ok=True)
    sw, ws = _ctx(ctx, x.device)
    out = _linear(x, w, bias, sw, ws, out_dtype)
    return out if out_dtype is None else out.to(out_dtype)


def glu_on_gluon(x, w, sw) -> bool:
    """Whether x's one-row q8 GEMV by w runs on the Gluon kernel (gemv_q8.glu_route; norm_rope_act.swiglu
    leaves no row to such a down at Switches.gemv_glu_prologue 1)."""
    rw = gemv_repack.planes_of(w) if sw.gemv else None
    return rw is not None and _gemv_rows(x, w, sw) and gemv_q8.glu_route(rw, sw.gemv_q8_gluon, table_arg(sw),
                                                                         x.device, interpret())[0]


def glu_planes(x, w, sw):
    """The repacked planes whose q8 GEMV (Triton; Gluon at Switches.gemv_glu_prologue 2 where
    gemv_q8.glu_route allows) takes x's deferred SwiGLU (x.glu_row) in its GLU prologue, or None -- the
    row then made first (a counted `swiglu.into_gemv` fallback) unless none is pending."""
    glu = getattr(x, "glu_row", None)
    if glu is None or glu.done:
        return None
    rw = gemv_repack.planes_of(w) if sw.gemv else None
    on_g, why = False, "no repacked planes" if rw is None else "rows the batch engine's dense plane takes"
    if rw is not None and _gemv_rows(x, w, sw):
        on_g, why = gemv_q8.glu_route(rw, sw.gemv_q8_gluon, table_arg(sw), x.device, interpret())
        if on_g and why is None and sw.gemv_glu_prologue < 2:
            why = "a Gluon launch, whose GLU prologue is off at MINFER_GEMV_GLU_PROLOGUE=1"
    if why is None:
        return rw
    paths.fallback("swiglu.into_gemv", f"{w.name}: {why}")
    glu.materialize()
    return None


def _linear(x, w, bias, sw, ws, out_dtype=None):
    n, k = w.shape
    rw = glu_planes(x, w, sw)
    if rw is not None:        # (one row: silu(gate) * up made in the down GEMV's programs)
        paths.count(f"qmatmul.{dequant.type_name(w.qtype)}.decode.q8glu")
        glu = x.glu_row
        return gemv_q8.gemv_q8(None, rw, bias=ws.group_bias((w,), (bias,), torch.float32) if bias is not None
                               else None, out_dtype=out_dtype or x.dtype, ws=ws.gemv_counters(), interpret=interpret(),
                               glu=(glu.gate, glu.up), **_q8_kw(sw, x))
    if x.stride(-1) != 1:
        x = x.contiguous()
    tname = dequant.type_name(w.qtype)
    m = x.shape[0]
    if sw.dense_gemv_max_m < m <= sw.qgemm_max_m:
        out = _qgemm_q8(x, (w,), (bias,), f"qmatmul.{tname}.qgemm_q8", sw, ws)
        if out is None:
            out = _qgemm(x, (w,), (bias,), f"qmatmul.{tname}.qgemm", sw, ws)
        if out is not None:
            return out
    if _w4_rows(m, sw):
        out = _w4(x, (w,), (bias,), getattr(w, "batch_w4", None), f"qmatmul.{tname}.w4", sw, ws)
        if out is not None:
            return out
    plane = _dense_plane(x, w, getattr(w, "batch_dense", None), sw)
    if plane is not None:
        # a resident copy in the activations' dtype, made for the batch engine (runtime/dense_planes.py
        # attach_dense_planes): cuBLAS reads 2 bytes per weight and decodes nothing. Small M on a
        # weight with repacked GEMV planes (gemv_repack.py) stays on that GEMV, which reads 4.5-6.5
        # bits per weight, up to dense_gemv_max_m rows (H200: the GEMV's tl.dot path lost to cuBLAS
        # from 16 rows on; docs/perf-log.md, lead runs of 2026-11-30)
        paths.count(f"qmatmul.{tname}.dense_plane")
        return F.linear(x, plane, ws.group_bias((w,), (bias,), x.dtype))   # cached cast (not one per call)
    if m <= sw.gemv_max_m:
        path = f"qmatmul.{tname}.decode"
        if sw.gemv:
            rw = gemv_repack.planes_of(w)
            q8 = getattr(x, "q8", None)
            if rw is not None and q8 is not None and m == 1:
                # the row's int8 form made with it (add_rms_norm / swiglu, Switches.gemv_q8): dp4a GEMV
                paths.count(path + ".q8")
                return gemv_q8.gemv_q8(q8, rw, bias=ws.group_bias((w,), (bias,), torch.float32) if bias is not None
                                       else None, out_dtype=out_dtype or x.dtype, ws=ws.gemv_counters(),
                                       interpret=interpret(),
                                       **_q8_kw(sw, x))
            if rw is not None:   # Q4_K/Q6_K planes made at load (Switches.gemv_repack)
                paths.count(path + ".repacked")
                return gemv_repack.gemv(x, rw, bias=bias, ws=ws.gemv_counters(), interpret=interpret())
            if gemv_repack.is_repacked_type(w.qtype) and getattr(w, "repack_skip", None) is None:
                # (a weight kept raw on purpose at load -- the tied embedding -- is the raw path only)
                if not sw.gemv_repack:
                    paths.switched_off(path + ".repacked", "MINFER_GEMV_REPACK")
                else:
                    paths.fallback(path + ".repacked", "the weight was not repacked at load (not built by an Engine)")
            paths.count(path + gemv.pass_suffix(m, n, k, sw.gemv_one_pass))
            return gemv.gemv(x, w.raw, w.qtype, n, k, bias=bias, interpret=interpret(), **gemv.raw_kw(sw, x))
        paths.switched_off(path, "MINFER_GEMV")
    direct = w.qtype in dequant.FLOAT_TYPES and _float_view(w).dtype == x.dtype
    if ws.runner_on(sw) and not direct:
        return run_group(x, (w,), (bias,), f"qmatmul.{tname}.prefill", sw, ws)[0]
    return _prefill(x, w, bias, tname, sw, ws)


def _qgemm(x, wts, biases, path, sw, ws):
    """Batched decode rows (dense_gemv_max_m < M <= qgemm_max_m) through the GEMM over the
    weights' repacked planes (qgemm_repack.py; Switches.qgemm_repack, default off until measured
    on the GPU) instead of the dense bf16 planes; None when it does not apply (the caller goes on)."""
    w0 = wts[0]
    grp = getattr(w0, "repacked_group", None) if len(wts) > 1 else None
    rw = grp[1] if grp is not None and grp[0] == wts else gemv_repack.planes_of(w0) if len(wts) == 1 else None
    if rw is None:
        if (len(wts) == 1 and sw.qgemm_repack and gemv_repack.is_repacked_type(w0.qtype)
                and getattr(w0, "repack_skip", None) is None):
            paths.fallback(path, "the weight was not repacked at load (not built by an Engine)")
        return None
    if not sw.qgemm_repack:
        paths.switched_off(path, "MINFER_QGEMM_REPACK")
        return None
    if rw.tile_rows:
        paths.fallback(path, "the planes are tile-major (the Gluon decode GEMV's layout); this GEMM reads row-major")
        return None
    paths.count(path)
    out = qgemm_repack.qgemm(x, rw, bias=ws.group_bias(wts, biases, torch.float32), out_dtype=x.dtype,
                             ws=ws.gemv_counters(), interpret=interpret())
    return out if len(wts) == 1 else list(torch.split(out, [w.shape[0] for w in wts], dim=1))


def _qgemm_q8(x, wts, biases, path, sw, ws, q8=None):
    """Batched decode rows (dense_gemv_max_m < M <= qgemm_max_m) through the int8 tensor-core GEMM
    over the repacked planes (qgemm_q8.py; Switches.qgemm_q8, default off until measured on the
    GPU): x's int8 rows (x.q8 when its producer made them, else quantized here, once per call),
    then one launch; None when it does not apply (the caller goes on)."""
    grp = getattr(wts[0], "repacked_group", None) if len(wts) > 1 else None
    rw = grp[1] if grp is not None and grp[0] == wts else gemv_repack.planes_of(wts[0]) if len(wts) == 1 else None
    if rw is None:
        return None
    if not sw.qgemm_q8:
        paths.switched_off(path, "MINFER_QGEMM_Q8")
        return None
    if rw.tile_rows:
        paths.fallback(path, "the planes are tile-major (the Gluon decode GEMV's layout); this GEMM reads row-major")
        return None
    m, k = x.shape
    if q8 is None:
        q8 = getattr(x, "q8", None)
    if q8 is None or tuple(q8[0].shape) != (m, k // 4):
        q8 = gemv_q8.quantize_rows(x, interpret=interpret())
    paths.count(path)
    out = qgemm_q8.qgemm_q8(q8, rw, bias=ws.group_bias(wts, biases, torch.float32), out_dtype=x.dtype,
                            ws=ws.gemv_counters(), interpret=interpret())
    return out if len(wts) == 1 else list(torch.split(out, [w.shape[0] for w in wts], dim=1))


def _w4_rows(m: int, sw) -> bool:
    """Whether m batched rows take qgemm_w4 on weights that have its planes: qgemm_w4_min_m (at
    least 2) .. qgemm_w4_max_m. Independent of dense_gemv_max_m, which decides GEMV vs cuBLAS for
    the weights without them (q/k/v, o)."""
    return max(2, sw.qgemm_w4_min_m) <= m <= sw.qgemm_w4_max_m


def _w4(x, wts, biases, planes, path, sw, ws):
    """Batched decode rows through the Gluon GEMM over the weight's (group's) fragment planes
    (ops/cuda/qgemm_w4_mma.py; made by runtime/dense_planes.attach_w4_planes for the shapes it
    beats cuBLAS on); None when it does not apply (the caller goes on to the dense plane)."""
    if planes is None:
        return None
    if x.dtype != torch.bfloat16:
        paths.fallback(path, f"{x.dtype} rows (the kernel multiplies bf16)")
        return None
    if not sw.qgemm_w4:
        paths.switched_off(path, "MINFER_QGEMM_W4")
        return None
    from minfer.ops.cuda import qgemm_w4_mma

    paths.count(path)
    return qgemm_w4_mma.qgemm_w4_mma(x, planes, bias=ws.group_bias(wts, biases, torch.float32), ws=ws.gemv_counters(),
                                     ring=sw.qgemm_w4_ring)


def _raw_group(x, wts, biases, rg, sw, ws):
    """The decode rows of a group whose leading weights share one raw block tensor
    (gemv.fuse_raw_group: q/k/v or gate/up not repacked, e.g. Q5_0 at a hidden size that is no
    multiple of 256) in one raw GEMV launch, the rest weight by weight; None where the group's
    rows go elsewhere (Switches.gemv_raw_fuse off, or the batch engine's dense planes). x's deferred
    norm (x.raw_prenorm) is made by that launch's programs where it runs in one pass (counted
    `gemv.raw_norm`; h and s stored by it, so the rest read h), else run first (_realized)."""
    lead, cat = rg
    path = f"qmatmul.group{len(lead)}.decode.raw"
    if not sw.gemv_raw_fuse:
        paths.switched_off(path, "MINFER_GEMV_RAW_FUSE")
        return None
    if any(_dense_plane(x, w, getattr(w, "batch_dense", None), sw) is not None for w in lead):
        return None
    n, k = sum(w.shape[0] for w in lead), lead[0].shape[1]
    raw, norm = getattr(x, "raw_prenorm", None), None
    if raw is not None and not raw.done and sw.gemv_one_pass and gemv.one_pass_tile(x.shape[0], n, k) is not None:
        paths.count("gemv.raw_norm")
        norm, raw.done = (raw.x, raw.y, raw.weight, raw.eps, raw.s), True
    if norm is None:
        _realized(x, "the raw group's GEMV does not run in one pass")
    if x.stride(-1) != 1:
        x = x.contiguous()
    paths.count(path + gemv.pass_suffix(x.shape[0], n, k, sw.gemv_one_pass))
    out = gemv.gemv(x, cat, lead[0].qtype, n, k, bias=ws.group_bias(lead, biases[:len(lead)], torch.float32),
                    interpret=interpret(), norm=norm, **gemv.raw_kw(sw, x))
    rest = [_linear(x, w, b, sw, ws) for w, b in zip(wts[len(lead):], biases[len(lead):])]
    return list(torch.split(out, [w.shape[0] for w in lead], dim=1)) + rest


def _dense_plane(x, w, plane, sw):
    """plane (w's, or its group's, dense copy) when x's rows are multiplied through it by cuBLAS:
    in x's dtype, and not rows that stay on w's repacked GEMV (at most dense_gemv_max_m)."""
    if plane is None or plane.dtype != x.dtype:
        return None
    if x.shape[0] <= min(sw.dense_gemv_max_m, sw.gemv_max_m) and sw.gemv and getattr(w, "repacked", None) is not None:
        return None
    return plane


def _gemv_rows(x, w, sw) -> bool:
    """Whether x's rows stay on the repacked GEMV when w also has the batch engine's dense bf16
    plane: up to dense_gemv_max_m rows (the single weight's rule in _linear), so a batch of a few
    sequences keeps the fused group GEMVs of the one-user decode."""
    return getattr(w, "batch_dense", None) is None or x.shape[0] <= min(sw.dense_gemv_max_m, sw.gemv_max_m)


def linear_swiglu(x: torch.Tensor, wts, ctx: Context | None = None):
    """One decode row through a (gate, up) pair with fused repacked planes (Model.decode_groups)
    and SwiGLU, in one launch (gemv_q8.gemv_q8_swiglu, Switches.gemv_swiglu): h (1, F) with its
    int8 form `.q8` for the down projection; None when this path does not apply."""
    sw, ws = _ctx(ctx, x.device)
    grp = getattr(wts[0], "repacked_group", None)
    pre = getattr(x, "prenorm", None)
    if (pre is not None and pre.q8 is None and not sw.gemv_swiglu) or grp is None:
        return None         # (the pair's GEMV in linear_many takes the deferred norm; nothing run here)
    _realized(x, "the gate/up SwiGLU GEMV has no norm prologue")
    q8 = getattr(x, "q8", None)
    if (grp is None or grp[0] != tuple(wts) or x.shape[0] != 1 or q8 is None or not sw.gemv
            or not _gemv_rows(x, wts[0], sw)):
        return None
    path = "qmatmul.group2.decode.q8swiglu"
    if not sw.gemv_swiglu:
        paths.switched_off(path, "MINFER_GEMV_SWIGLU")
        return None
    rw = grp[1]
    bn = gemv_q8.config_for(rw.qtype, rw.n, rw.k, interpret())[0]
    f = rw.n // 2
    if wts[0].shape[0] != wts[1].shape[0] or f % 256:
        return None        # no int8 row for the down projection either (norm_rope_act.q8_row_ok): not this path
    if f % bn or bn % 32:
        paths.fallback(path, f"gate/up of {wts[0].shape[0]}/{wts[1].shape[0]} rows do not pair in {bn}-row tiles "
                             "of a multiple of 256")
        return None
    paths.count(path)
    h, hq = gemv_q8.gemv_q8_swiglu(q8, rw, out_dtype=x.dtype, ws=ws.gemv_counters(), interpret=interpret(),
                                   paired=int(sw.gemv_swiglu) == 2, **_q8_kw(sw, x, late=True, glu=True))
    h.q8 = hq
    return h


def _prenorm_group(x, wts, biases, pre, sw, ws) -> list | None:
    """The group's one q8 GEMV launch doing x's deferred norm in its programs (gemv_q8's prenorm;
    it runs the norm kernel first where the Gluon kernel cannot take the shape, counted), or None
    when the group has no such launch (the caller materializes the norm)."""
    found = decode_group_planes(x, wts, sw)
    if found is None:
        return None
    planes, mixed = found
    path = f"qmatmul.group{len(wts)}.decode.q8" + ("mixed" if mixed else "")
    return _group_q8(x, wts, biases, None, planes, path, sw, ws, prenorm=pre)


def decode_group_planes(x, wts, sw) -> tuple | None:
    """(planes, mixed) of the one-launch q8 GEMV over the group wts for one decode row x: the group's
    fused planes (mixed False) or its q/k + v pair (gemv_repack_layout.fuse_group; True); None when
    x is not one row on the repacked GEMV or wts is not such a group."""
    if x.shape[0] != 1 or not sw.gemv or not _gemv_rows(x, wts[0], sw):
        return None
    wts = tuple(wts)
    grp = getattr(wts[0], "repacked_group", None)
    segs = getattr(wts[0], "repacked_segments", None)
    if grp is not None and grp[0] == wts:
        return grp[1], False
    if segs is not None and segs[0] == wts:
        return segs[1], True
    return None


def _group_q8(x, wts, biases, q8, planes, path: str, sw, ws, prenorm=None) -> list:
    """One q8 GEMV launch over a group's fused planes (gemv_repack.fuse_group; a pair of
    segments for q/k + a v of another type), counted as `path`; the column views per weight."""
    paths.count(path)
    out = gemv_q8.gemv_q8(q8, planes, bias=ws.group_bias(wts, biases, torch.float32), out_dtype=x.dtype,
                          ws=ws.gemv_counters(), interpret=interpret(), prenorm=prenorm,
                          **_q8_kw(sw, x, late=len(wts) == 3 and sw.decode_attn_rope))   # (q/k/v: the attention)
    return list(torch.split(out, [w.shape[0] for w in wts], dim=1))


def linear_qkv_rope(x, wts, biases, positions, cfg, k_cache, v_cache, ctx: Context | None = None):
    """ops.linear_qkv_rope: gemv_q8_gluon_rope.linear_qkv_rope under the call's switches."""
    from minfer.ops.cuda.gemv_q8_gluon_rope import linear_qkv_rope as run

    sw, ws = _ctx(ctx, x.device)
    return run(x, tuple(wts), tuple(biases), positions, cfg, k_cache, v_cache, sw, ws)


def linear_many(x: torch.Tensor, wts, biases, ctx: Context | None = None) -> list:
    """The same x (T, K) through several weights of one K -> [(T, N_i)].

    Decode M: the GEMV per weight. Prefill M: a group the model declared goes through one
    scratch and one GEMM (see the module doc); other weights one by one."""
    wts, biases = tuple(wts), tuple(biases)
    for w in wts:
        _check(x, w)
    sw, ws = _ctx(ctx, x.device)
    pre = getattr(x, "prenorm", None)
    if pre is not None and pre.q8 is None:
        outs = _prenorm_group(x, wts, biases, pre, sw, ws)
        if outs is not None:
            return outs
        _realized(x, "the group has no one-launch q8 GEMV (fused planes) for this row")
    rg = getattr(wts[0], "raw_group", None)
    rg_rows = rg is not None and wts[:len(rg[0])] == rg[0] and x.shape[0] <= sw.gemv_max_m and sw.gemv
    if getattr(x, "raw_prenorm", None) is not None:       # (a raw group's launch makes the norm: _raw_group)
        outs = _raw_group(x, wts, biases, rg, sw, ws) if rg_rows else None
        if outs is not None:
            return outs
        _realized(x, "the group is not one raw-block GEMV launch")
    if x.stride(-1) != 1:
        x = x.contiguous()
    grp = getattr(wts[0], "repacked_group", None)
    if grp is not None and grp[0] == wts and sw.dense_gemv_max_m < x.shape[0] <= sw.qgemm_max_m:
        outs = _qgemm_q8(x, wts, biases, f"qmatmul.group{len(wts)}.qgemm_q8", sw, ws)
        if outs is None:
            outs = _qgemm(x, wts, biases, f"qmatmul.group{len(wts)}.qgemm", sw, ws)
        if outs is not None:
            return outs
    segs8 = getattr(wts[0], "repacked_segments", None)
    if (segs8 is not None and segs8[0] == wts and sw.qgemm_q8
            and sw.dense_gemv_max_m < x.shape[0] <= sw.qgemm_max_m):
        # q/k + a v of another type (gemv_repack_layout.fuse_group): weight by weight on the int8
        # GEMM, the rows quantized once
        q8 = getattr(x, "q8", None)
        if q8 is None or tuple(q8[0].shape) != (x.shape[0], x.shape[1] // 4):
            q8 = gemv_q8.quantize_rows(x, interpret=interpret())
        outs = [_qgemm_q8(x, (w,), (b,), f"qmatmul.{dequant.type_name(w.qtype)}.qgemm_q8", sw, ws, q8=q8)
                for w, b in zip(wts, biases)]
        if all(o is not None for o in outs):
            return outs
    wg = getattr(wts[0], "batch_w4_group", None)
    if wg is not None and wg[0] == wts and _w4_rows(x.shape[0], sw):
        out = _w4(x, wts, biases, wg[1], f"qmatmul.group{len(wts)}.w4", sw, ws)
        if out is not None:
            return list(torch.split(out, [w.shape[0] for w in wts], dim=1))
    if (grp is not None and grp[0] == wts and x.shape[0] <= sw.gemv_max_m and sw.gemv
            and _gemv_rows(x, wts[0], sw)):
        # one GEMV over the group's concatenated planes (gemv_repack.fuse_group); column views out
        q8 = getattr(x, "q8", None)
        if q8 is not None and x.shape[0] == 1:
            return _group_q8(x, wts, biases, q8, grp[1], f"qmatmul.group{len(wts)}.decode.q8", sw, ws)
        paths.count(f"qmatmul.group{len(wts)}.decode.repacked")
        out = gemv_repack.gemv(x, grp[1], bias=ws.group_bias(wts, biases, torch.float32), out_dtype=x.dtype,
                               ws=ws.gemv_counters(), interpret=interpret())
        return list(torch.split(out, [w.shape[0] for w in wts], dim=1))
    segs = getattr(wts[0], "repacked_segments", None)
    if (segs is not None and segs[0] == wts and x.shape[0] == 1 and sw.gemv and getattr(x, "q8", None) is not None
            and _gemv_rows(x, wts[0], sw)):
        # q/k fused + a v of another type (gemv_repack_layout.fuse_group): one int8 GEMV launch
        return _group_q8(x, wts, biases, x.q8, segs[1], f"qmatmul.group{len(wts)}.decode.q8mixed", sw, ws)
    dg = getattr(wts[0], "batch_dense_group", None)
    if dg is not None and dg[0] == wts and _dense_plane(x, wts[0], dg[1], sw) is not None:
        # the group's one dense plane (runtime/dense_planes.attach_dense_planes): one cuBLAS GEMM,
        # column views out (as the group GEMV gives); small M on repacked weights keeps the GEMV
        paths.count(f"qmatmul.group{len(wts)}.dense_plane")
        out = F.linear(x, dg[1], ws.group_bias(wts, biases, x.dtype))
        return list(torch.split(out, [w.shape[0] for w in wts], dim=1))
    if rg_rows:
        outs = _raw_group(x, wts, biases, rg, sw, ws)
        if outs is not None:
            return outs
    if (len(wts) == 1 or (x.shape[0] <= sw.gemv_max_m and sw.gemv) or wts not in ws.groups
            or getattr(wts[0], "batch_dense", None) is not None):
        return [_linear(x, w, b, sw, ws) for w, b in zip(wts, biases)]
    path = f"qmatmul.group{len(wts)}.prefill"
    if not sw.fuse_groups:
        paths.switched_off(path, "MINFER_FUSE_GROUPS")
        return [_linear(x, w, b, sw, ws) for w, b in zip(wts, biases)]
    return run_group(x, wts, biases, path, sw, ws)


# ops.linear_add_rms_norm lives in linear_norm.py (this module's size); the name stays here for its callers
from minfer.ops.cuda.linear_norm import linear_add_rms_norm  # noqa: E402,F401
