"""The q/k/v GEMV with rope and the KV cache append in its epilogue (Switches.qkv_rope; issue 12):
one launch for what the group's q8 GEMV and norm_rope_act's rope_kv kernel did in two.

`linear_qkv_rope` (ops.linear_qkv_rope, through KVCache.project_rotated) takes a decode row through
a layer's q/k/v group -- its fused planes or the q/k + Q6_K v pair (gemv_repack_layout.fuse_group)
-- on the Gluon kernel of the group's table config, whose epilogue (gemv_q8g_rope) stores q rotated
and writes rope(k) and v at the step's position of the caches. Where the Gluon kernel or the rope
epilogue cannot take it (another GPU, the interpreter, a config with a K split, a head dim the tiles
do not divide), the GEMV runs as before and the rope_kv kernel after it, counted as the fallback
`gemv_q8.rope`. Where the layer has no such group (prefill, other caches, qk-norm models) or the
group's shape is the Triton kernel's (not in the Gluon table, the interpreter: as the GEMV, not a
fallback) it returns None and the caller runs linear_many + rope + write as before. Switches.qkv_rope 2 (the default) has
this launch signal the attention at its programs' end (PDL mode 3), 1 after its wait.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from minfer.ops import paths
from minfer.ops.cuda.gemv_q8_gluon import _mixed_tile, _opts, _pdl_mode, _pf, _prefetch2_error, _tile, kernel_planes
from minfer.ops.cuda.gemv_repack_layout import common_tile_rows
from minfer.ops.cuda.timeline import stamp


@gluon.jit
def _gemv_q8g_rope_kernel(p0, p1, p2, p3, r0, r1, r2, r3, xq, xf, bias, out, N, NA, TA, NB, bps, ny, nss, eps,
                          rp, rt, kc, vc, nq, nk, kvs, tlb, QT: gl.constexpr, QTB: gl.constexpr, MIXED: gl.constexpr,
                          BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr, HAS_BIAS: gl.constexpr,
                          PDL: gl.constexpr, PF: gl.constexpr, PRE: gl.constexpr, NORM: gl.constexpr,
                          KP2: gl.constexpr, WK: gl.constexpr, SF: gl.constexpr, TM: gl.constexpr, XP: gl.constexpr,
                          RP: gl.constexpr, HD: gl.constexpr, TL: gl.constexpr = False, RL: gl.constexpr = False):
    """The stacked q/k/v rows (N; MIXED: rows [0, NA) weight p of type QT in TA tiles, the rest
    weight r of type QTB) times x_hat, one program a BN-row tile of rotation pairs, the whole K
    (no split); the rope epilogue (_tile's RP). NORM 0 or 4 (x_hat without rstd: the row sums
    scaled by rstd from ny's nss tile sums; RL: summed after the K loop, _tile's RL). SF: the second
    weight's tiles take the low ids."""
    if TL:
        stamp(tlb, 0, NW)
    pid_n = gl.program_id(0)
    if MIXED:
        first, ia, ib = _mixed_tile(pid_n, TA, SF)
        if first:
            _tile(p0, p1, p2, p3, xq, xf, out, bias, out, out, out, ia, 0, NA, N, NB, bps, 1, xq, xf, 1,
                  out, ny, out, out, eps, nss, out, out, QT, BN, BB, NW, False, HAS_BIAS, False, PDL, PF, False,
                  PRE, NORM, KP2, 1, False, tlb, TL, WK=WK, TM=TM, XP=XP, RP=RP, HD=HD, row0=0, rp=rp, rt=rt,
                  kc=kc, vc=vc, nq=nq, nk=nk, kvs=kvs, RL=RL)
        else:
            _tile(r0, r1, r2, r3, xq, xf, out, bias + NA, out + NA, out, out, ib, 0, N - NA, N, NB, bps, 1, xq,
                  xf, 1, out, ny, out, out, eps, nss, out, out, QTB, BN, BB, NW, False, HAS_BIAS, False, PDL, PF,
                  False, PRE, NORM, KP2, 1, False, tlb, TL, WK=WK, TM=TM, XP=XP, RP=RP, HD=HD, row0=NA, rp=rp,
                  rt=rt, kc=kc, vc=vc, nq=nq, nk=nk, kvs=kvs, RL=RL)
    else:
        _tile(p0, p1, p2, p3, xq, xf, out, bias, out, out, out, pid_n, 0, N, N, NB, bps, 1, xq, xf, 1,
              out, ny, out, out, eps, nss, out, out, QT, BN, BB, NW, False, HAS_BIAS, False, PDL, PF, False,
              PRE, NORM, KP2, 1, False, tlb, TL, WK=WK, TM=TM, XP=XP, RP=RP, HD=HD, row0=0, rp=rp, rt=rt,
              kc=kc, vc=vc, nq=nq, nk=nk, kvs=kvs, RL=RL)
    if TL:
        stamp(tlb, 1, NW)


class Rope:
    """What the epilogue needs: positions (1,) int64 on the device, turns (Dh/2,) float64
    (norm_rope_act._turns), the layer's caches (S, Hkv, Dh), q's and k's row counts, the head dim,
    neox (pairs j, j + Dh/2) or normal (2j, 2j + 1), and the rope config (the fallback's rope_kv)."""

    def __init__(self, positions, turns, k_cache, v_cache, nq: int, nk: int, head_dim: int, neox: bool, cfg):
        self.positions, self.turns, self.k_cache, self.v_cache = positions, turns, k_cache, v_cache
        self.nq, self.nk, self.head_dim, self.neox, self.cfg = nq, nk, head_dim, neox, cfg


def refused(segs, cfg, split: int, rope: Rope, out_dtype) -> str | None:
    """Why the Gluon launch of config cfg (its K split `split`, as gemv_q8 resolved it) cannot carry
    the rope epilogue (None: it can)."""
    bn, hd = cfg[0], rope.head_dim
    n = sum(r.n for r in segs)
    if split != 1:
        return f"the Gluon config {tuple(cfg)} splits K ({split} programs a tile): the epilogue needs whole rows"
    if bn % 2 or hd % bn or segs[0].n % hd or n % hd or rope.nq % hd or rope.nk % hd or n != rope.nq + 2 * rope.nk:
        return f"{bn}-row tiles do not pair the rows of {n} q/k/v rows in heads of {hd}"
    kc, vc = rope.k_cache, rope.v_cache
    if not (kc.dtype == vc.dtype == out_dtype) or kc.stride()[1:] != (hd, 1) or vc.stride() != kc.stride():
        return f"caches {kc.dtype}/{vc.dtype} strides {kc.stride()}/{vc.stride()} for a {out_dtype} output"
    return None


def launch(segs, xq, xf, bias, out, n, na, ta, tiles, nb, bps, bn, bb, nwarps, pdl, rope: Rope, prefetch=True,
           late: bool = False, preload: bool = True, regs: int = 0, kwarps: bool = False, second_first: bool = False,
           x_ahead: bool = False, rscale=None, rstd_late: bool = False):
    """gemv_q8's Gluon launch (no K split) with the rope epilogue: out's first rope.nq values receive
    q rotated; k rotated and v go to the caches' row positions[0] (out's other values are not
    written). rscale, rstd_late as gemv_q8_gluon.launch's (NORM 4, RL). The caller checked `refused`."""
    from minfer.ops.cuda import timeline

    p = kernel_planes(segs[0])
    r = kernel_planes(segs[-1])
    if int(prefetch) == 2 and bps > 2 * bb:
        _prefetch2_error(n, nb, f"{bps}-block splits of {bb}-block steps")
    mode, ny, nss, eps, kp2 = 0, out, 0, 0.0, 1
    if rscale is not None:
        (ny, nss, eps), mode = rscale, 4
        kp2 = max(32 * nwarps, 1 << max(0, nss - 1).bit_length())
    rec = timeline.RECORDER
    tlb = rec.buffer(f"{n}x{nb * 256}", (tiles, 1), out.device) if rec is not None else out
    _gemv_q8g_rope_kernel[(tiles,)](
        p[0], p[1], p[2], p[3], r[0], r[1], r[2], r[3], xq, xf, bias if bias is not None else out, out, n, na, ta, nb,
        bps, ny, nss, float(eps), rope.positions, rope.turns, rope.k_cache, rope.v_cache, rope.nq, rope.nk,
        rope.k_cache.stride(0), tlb, QT=segs[0].qtype, QTB=segs[-1].qtype, MIXED=len(segs) == 2, BN=bn, BB=bb,
        NW=nwarps, HAS_BIAS=bias is not None, PDL=_pdl_mode(pdl, late), PF=_pf(prefetch), PRE=bool(preload),
        NORM=mode, KP2=kp2, WK=bool(kwarps), SF=bool(second_first) and len(segs) == 2, TM=common_tile_rows(segs),
        XP=bool(x_ahead), RP=1 if rope.neox else 2, HD=rope.head_dim, TL=rec is not None,
        RL=bool(rstd_late) and mode == 4, num_warps=nwarps, **_opts(pdl, regs))


def rope_after(out: torch.Tensor, rope: Rope, pdl: int) -> None:
    """The fallback: out's q rotated in place, rope(k) and v written, by the rope_kv kernel."""
    from minfer.ops.cuda.norm_rope_act import rope_kv_write

    hd, nq, nk = rope.head_dim, rope.nq, rope.nk
    q = out[:, :nq].view(1, nq // hd, hd)
    rope_kv_write(q, out[:, nq:nq + nk].view(1, nk // hd, hd), out[:, nq + nk:].view(1, nk // hd, hd),
                  rope.positions, rope.cfg, rope.k_cache, rope.v_cache, pdl=pdl, q_out=q)


def linear_qkv_rope(x: torch.Tensor, wts, biases, positions: torch.Tensor, cfg, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, sw, ws) -> torch.Tensor | None:
    """q (1, Hq * Dh) rotated, with rope(k) and v stored at row positions[0] of the layer's caches
    (S, Hkv, Dh), for a decode row x (1, D) through the q/k/v group wts: one q8 GEMV launch (module
    doc); None where the group has no such launch (the caller goes the usual way)."""
    from minfer.ops.cuda import qmatmul as QM
    from minfer.ops.cuda.norm_rope_act import _turns

    path = "qmatmul.qkv_rope"
    if not sw.qkv_rope:
        paths.switched_off(path, "MINFER_QKV_ROPE")
        return None
    hd = k_cache.shape[-1]
    if len(wts) != 3 or cfg.n_rot != hd or cfg.style not in ("neox", "normal") or x.dtype != k_cache.dtype:
        return None
    from minfer.ops.cuda.gemv_raw_rope import raw_qkv_rope     # (a raw-block group: the raw GEMV's epilogue)

    q = raw_qkv_rope(x, wts, biases, positions, cfg, k_cache, v_cache, sw, ws)
    if q is not None:
        return q
    found = QM.decode_group_planes(x, wts, sw)
    if found is None:
        return None
    planes = found[0]
    pre = getattr(x, "prenorm", None)
    q8 = getattr(x, "q8", None) if pre is None else None
    if (pre is None and q8 is None) or (pre is not None and pre.q8 is None and pre.q8u is None):
        return None            # (no q8 row; or norm_into_gemv 1-3's prologues, which this kernel has not)
    from minfer.ops.cuda import gemv_q8

    kw = QM._q8_kw(sw, x)
    segs_ = planes if isinstance(planes, tuple) else (planes,)
    use_g, _, why = gemv_q8._choose(segs_, sum(r.n for r in segs_), segs_[0].k, None, kw["gluon"] and not kw["l2"],
                                    QM.interpret(), kw["gluon_table"], x.device)
    if not use_g and why is None:
        return None            # the Triton kernel's shape (not in the Gluon table; the interpreter): the usual way
    paths.count(path)

    rope = Rope(positions.reshape(1), _turns(cfg, str(x.device)), k_cache, v_cache, wts[0].shape[0],
                wts[1].shape[0], hd, cfg.style == "neox", cfg)
    if sw.qkv_rope >= 2:
        # signal the attention when the programs end: launched at their wait, its programs would pile
        # onto the first SMs q/k/v frees (perf-log AJ1: the one-split attention 3 us slower)
        kw["pdl_late"] = bool(kw["pdl"])
    out = gemv_q8.gemv_q8(q8, planes, bias=ws.group_bias(wts, biases, torch.float32), out_dtype=x.dtype,
                          ws=ws.gemv_counters(), interpret=QM.interpret(), prenorm=pre if q8 is None else None,
                          rope=rope, **kw)
    return out[:, :rope.nq]
