"""ops.linear_add_rms_norm on CUDA: a layer's last GEMV, the residual add and the next norm, with
the norm made by the GEMV's epilogue or left to the next GEMV where Switches.norm_into_gemv asks
(moved out of qmatmul.py, which it uses, to keep that module under the size rule)."""

from __future__ import annotations

import torch

from minfer.ops import paths
from minfer.ops.context import Context


def linear_add_rms_norm(a: torch.Tensor, w, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype,
                        ctx: Context | None = None, into_linear: bool = False, role: str = "attn_norm") -> tuple:
    """(s, h) = (x + a @ w^T, rms_norm(s) * weight) (ops.linear_add_rms_norm). role: "attn_norm"
    (the down projection, then the next layer's attention norm) or "ffn_norm" (the o projection,
    then the layer's FFN norm: only mode 4 below takes it; otherwise linear, then add_rms_norm).
    With Switches.norm_into_gemv = 3, one decode row on the q8 Gluon GEMV: its epilogue stores s and the
    program finishing its last row tile makes h and h's q8 form (gemv_q8g_norm._norm_tail; h is
    whole, so any consumer may read it). With 2 and into_linear: its epilogue
    stores s (float32) and each row tile's sum of s^2 (gemv_q8.gemv_q8_residual), and h is left to
    the q/k/v GEMV that reads it (h.prenorm: q8_rows.PreNorm with those sums; counted
    `qmatmul.residual_norm`). With 4 and into_linear, for either role: that epilogue also makes
    the q8 form of s * weight tile by tile (rstd left out, gemv_q8g_norm._rss_q8), and the next
    q8 GEMV scales its row sums by rstd (PreNorm.q8u): no norm launch between the two GEMVs; on the
    FFN side (o, then gate+up directly) o signals gate+up when its programs end (with PDL): launched
    at o's wait, gate+up's programs would pile onto the SMs o leaves free (perf-log AI2, AL3). 5:
    4 for the attention norm (the down before q/k/v) only.
    Otherwise, and where that GEMV does not apply (counted as a fallback), linear then
    norm_rope_act.add_rms_norm, as before."""
    from minfer.ops.cuda import norm_rope_act
    from minfer.ops.cuda import qmatmul as QM    # (its helpers read at call time: a reload or a test's patch applies)

    QM._check(a, w)
    sw, ws = QM._ctx(ctx, a.device)
    # a deferred SwiGLU row (a.glu_row): the GLU prologue of the GEMV below, or made here where that cannot take it
    glu = a.glu_row if QM.glu_planes(a, w, sw) is not None else None
    ffn = role != "attn_norm"
    mode = sw.norm_into_gemv
    if ffn:
        mode = 4 if mode == 4 else -1       # (5: mode 4 for the attention norm only)
    elif mode == 5:
        mode = 4
    tail = mode == 3
    if (into_linear or tail) and mode >= 2 and a.shape[0] == 1 and (getattr(a, "q8", None) is not None or glu):
        rw = QM.gemv_repack.planes_of(w) if sw.gemv else None
        r, refused = None, []
        if rw is not None and x.dtype == torch.float32 and x.is_contiguous() and norm_rope_act.q8_row_ok(
                x.shape[1], out_dtype, sw):
            kw = QM._q8_kw(sw, a)
            r = QM.gemv_q8.gemv_q8_residual(None if glu else a.q8, rw, x, out_dtype, ws=ws.gemv_counters(),
                                         interpret=QM.interpret(),
                                         pdl=kw["pdl"], gluon=kw["gluon"] and not kw["l2"], gluon_table=kw["gluon_table"],
                                         preload=kw["preload"], tail=(weight, eps) if tail else None,
                                         rq=weight if mode == 4 else None, refused=refused,
                                         rq_smem=sw.rq_smem, late=sw.o_signal if ffn and mode == 4 else 0,
                                         l2_heads=kw["l2_heads"], glu=(glu.gate, glu.up) if glu else None,
                                         split_gather=kw["split_gather"])
        if r is not None:
            paths.count("qmatmul.residual_norm")
            if glu:
                paths.count(f"qmatmul.{QM.dequant.type_name(w.qtype)}.decode.q8glu")
            if tail:     # h and its q8 form made by the GEMV's last tile: a whole tensor, no deferred norm
                return r[0], r[2]
            s, ssp = r[0], r[1]
            q8u = r[2] if mode == 4 else None
            if mode == 4 and q8u is None:
                paths.fallback("gemv_q8.residual_q8", f"{w.name}: the GEMV's row tiles are not whole 32-value q8 "
                               "chunks (its config's BN): the next GEMV's programs or the norm kernel make the row")
            return s, norm_rope_act.deferred_norm(s, None, weight, eps, s, out_dtype, sw, ssp=ssp, q8u=q8u)
        if mode != 4 or refused:
            # (mode 4 / 5, the default: a shape outside the Gluon kernel's table or the interpreter takes the
            # two launches as the GEMV itself takes the Triton kernel there -- not a fallback; a refusal is)
            paths.fallback("qmatmul.residual_norm", "the layer's last GEMV is not the q8 Gluon kernel for this row ("
                           + (refused[0] if refused else "no repacked planes, no int8 row, a shape outside its table, "
                              "or the interpreter") + ")")
    if sw.gemv_raw_resnorm and a.shape[0] == 1:
        r = _raw_resnorm(a, w, x, weight, eps, out_dtype, sw, ws)
        if r is not None:
            return r
    y = None
    if sw.gemv_q8_resnorm and not ffn and a.shape[0] == 1 and x.shape[1] % 256:
        y = _q8_resnorm(a, w, x, weight, eps, out_dtype, sw, ws, glu)
        if y is not None and hasattr(y, "rn"):
            return y.rn
    if y is None:
        y = QM._linear(a, w, None, sw, ws)
    # (modes 3 and 4, and the FFN norm (mode -1): the norm kernel; modes 1 and 2: mode 1's norm in the
    # q/k/v programs; 0: the norm kernel, the deferral counted as switched off)
    return norm_rope_act.add_rms_norm(x, y, weight, eps, out_dtype, ctx, into_linear=into_linear and mode in (0, 1, 2),
                                      role=role, raw_ok=into_linear)


def _one_row_plain(a, w, sw) -> bool:
    """Whether qmatmul._linear takes this one-row decode by a GEMV over w's own planes or blocks: not the batch
    engine's dense planes, its w4 or q8 GEMM paths."""
    from minfer.ops.cuda import qmatmul as QM

    return (sw.gemv and sw.gemv_max_m >= 1 and not sw.dense_gemv_max_m < 1 <= sw.qgemm_max_m
            and not QM._w4_rows(1, sw) and QM._dense_plane(a, w, getattr(w, "batch_dense", None), sw) is None)


def _q8_resnorm(a, w, x, weight, eps, out_dtype, sw, ws, glu):
    """y = a @ w^T by the q8 GEMV (qmatmul._linear's two q8 branches: the GLU prologue's deferred row, or a's
    int8 form) with the residual norm tail asked for (Switches.gemv_q8_resnorm): y.rn = (s, h) where the
    Triton kernel took it; y alone where it did not (a counted fallback: the caller runs the add + norm kernel on
    y); None where this row's linear is no Triton q8 GEMV (the Gluon kernel's shapes included: qmatmul._linear
    runs as with the switch off). The next norm's row has no int8 form here (its K is no multiple of 256), so h
    alone is whole."""
    from minfer.ops.cuda import qmatmul as QM

    rw = QM.gemv_repack.planes_of(w) if _one_row_plain(a, w, sw) else None
    q8 = getattr(a, "q8", None)
    if (rw is None or (glu is None and q8 is None) or x.dtype != torch.float32 or not x.is_contiguous()
            or tuple(x.shape) != (1, w.shape[0])):
        return None
    n = w.shape[0]
    kw = QM._q8_kw(sw, a)
    if QM.gemv_q8._choose((rw,), n, rw.k, None, kw["gluon"] and not kw["l2"], QM.interpret(), kw["gluon_table"],
                          a.device)[0]:
        return None             # (the Gluon kernel takes this shape: its own residual paths, or the two launches)
    tname = QM.dequant.type_name(w.qtype)
    paths.count(f"qmatmul.{tname}.decode.q8glu" if glu else f"qmatmul.{tname}.decode.q8")
    s = torch.empty((1, n), dtype=torch.float32, device=a.device)
    h = torch.empty((1, n), dtype=out_dtype, device=a.device)
    y = QM.gemv_q8.gemv_q8(None if glu else q8, rw, out_dtype=a.dtype, ws=ws.gemv_counters(), interpret=QM.interpret(),
                           glu=(glu.gate, glu.up) if glu else None, resnorm=(x, weight, float(eps), s, h), **kw)
    if not hasattr(y, "rn"):
        paths.fallback("gemv_q8.resnorm", f"{w.name}: the Triton q8 GEMV did not take the norm tail (a row over "
                       f"{QM.gemv_q8.RN_MAX}): the add + norm kernel runs after it")
    return y


def _raw_resnorm(a, w, x, weight, eps, out_dtype, sw, ws):
    """(s, h) from the raw one-pass GEMV with the residual norm epilogue (Switches.gemv_raw_resnorm;
    gemv.gemv_resnorm), where this row's linear is that GEMV (qmatmul._linear's raw branch for one row: no
    repacked planes, none of the batch engine's); None otherwise (a K past the one-pass tile included):
    the caller runs the GEMV and the add + norm kernel, as with the switch off."""
    from minfer.ops.cuda import gemv as G
    from minfer.ops.cuda import qmatmul as QM

    if (not sw.gemv_one_pass or not _one_row_plain(a, w, sw) or QM.gemv_repack.planes_of(w) is not None
            or QM.gemv_repack.is_repacked_type(w.qtype)):
        return None
    QM._realized(a, "the raw GEMV with the residual norm epilogue")
    n, k = w.shape
    r = G.gemv_resnorm(a, w.raw, w.qtype, n, k, x, weight, eps, out_dtype, ws.gemv_counters().counters(1),
                       interpret=QM.interpret(), pdl=G.raw_pdl(sw, a), halfwords=sw.gemv_raw_halfwords)
    if r is not None:
        paths.count(f"qmatmul.{QM.dequant.type_name(w.qtype)}.decode.one_pass")
    return r
