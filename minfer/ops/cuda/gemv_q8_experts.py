"""The one-row int8 GEMV over a MoE layer's selected experts (issue 16): the experts' matrices
stacked in one repacked weight, each slot's expert id read on the device, one launch for all
slots (ops/cuda/moe.py's gather path). The tile is gemv_q8's (_q8_tile), the config its table's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_q8 import _q8_tile, _split_scratch, config_for
from minfer.ops.cuda.gemv_repack import Q4_K, Q6_K, GemvWorkspace, Repacked, _planes4


@triton.jit
def _moe_q8_kernel(p0, p1, p2, p3, rs0, rs1, rs2, rs3, xq, xf, xs_q, xs_f, eidx, out, part, cnt,
                   N, NB, TILES, blocks_per_split, SPLIT,
                   QT: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, IS_SPLIT: tl.constexpr,
                   ASM: tl.constexpr, PREFETCH: tl.constexpr):
    """Slot s = program_id(2): out[s] (N,) = W_e . x_hat_s with e = eidx[s], W_e rows [e*N,
    (e+1)*N) of the stacked planes (row strides rs*), x row s (xs_q / xs_f apart; 0: shared)."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    slot = tl.program_id(2)
    e = tl.load(eidx + slot).to(tl.int64) * N
    _q8_tile(p0 + e * rs0, p1 + e * rs1, p2 + e * rs2, p3 + e * rs3, xq + slot * xs_q, xf + slot * xs_f,
             out, out, out + slot * N, part + slot * N, cnt + slot * TILES, pid_n, pid_s, N, N * tl.num_programs(2),
             NB, 0, blocks_per_split, SPLIT, xq, xf, 1, False, QT, BN, BB, IS_SPLIT, False, False, ASM, PREFETCH)


def gemv_q8_experts(q8, rw: Repacked, experts: torch.Tensor, n: int, per_slot_x: bool = False,
                    out_dtype=torch.bfloat16, ws: GemvWorkspace | None = None, asm: bool | None = None,
                    interpret: bool = False, config=None) -> torch.Tensor:
    """out (S, n): row s = expert experts[s]'s matrix (rows [e*n, (e+1)*n) of the stacked
    repacked weight) times x_hat, in one launch; x_hat the one q8 row, or row s of a (S, K/4)
    q8 pair when per_slot_x. experts (S,) int64 on the device (no host read: graph-safe)."""
    xq, xf = q8
    k = rw.k
    s_n = experts.shape[0]
    if rw.n % n or rw.qtype not in (Q4_K, Q6_K):
        raise MinferError(f"gemv_q8_experts: {rw.n} stacked rows are not experts of {n} rows (or type {rw.qtype})")
    if rw.tile_rows:
        raise MinferError("gemv_q8_experts: the stacked experts' planes are tile-major; this kernel reads row-major")
    if xq.numel() * 4 != k * (s_n if per_slot_x else 1):
        raise MinferError(f"gemv_q8_experts: activations have {xq.numel() * 4} values for K = {k}")
    bn, bb, split, nwarps, prefetch = tuple(config or config_for(rw.qtype, n * s_n, k, interpret))
    nb = k // 256
    out = torch.empty((s_n, n), dtype=out_dtype, device=xq.device)
    tiles = triton.cdiv(n, bn)
    bps, split, part, cnt = _split_scratch(nb, split, bb, s_n * n, tiles * s_n, ws, out)
    p = _planes4(rw)
    st = [t.stride(0) for t in p]
    _moe_q8_kernel[(tiles, split, s_n)](p[0], p[1], p[2], p[3], st[0], st[1], st[2], st[3], xq, xf,
                                        k // 4 if per_slot_x else 0, k // 8 if per_slot_x else 0, experts, out,
                                        part, cnt, n, nb, tiles, bps, split, QT=rw.qtype, BN=bn, BB=bb,
                                        IS_SPLIT=split > 1, ASM=(not interpret) if asm is None else asm,
                                        PREFETCH=bool(prefetch), num_warps=nwarps, num_stages=1)
    return out
