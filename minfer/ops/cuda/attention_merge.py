"""The one-token decode attention's key splits merged inside its own kernel (Switches.decode_attn_merge).

Why: attention._decode_attn_kernel writes each split's (acc, max, sum) partials and
attention._combine_kernel merges them in a second launch. In the 7B's graphed decode step that
launch cost ~2.4 us of the ~63 us per layer, nearly all launch and PDL-wait latency, 28 times a
token. With MERGE the kernel ends as paged_attention's batched path does: after its partials are
stored (a CTA barrier, then one acq_rel ticket per KV head), the program that draws the KV head's
last ticket merges all its splits and writes the output, and the o projection's int8 form with
it (q8_rows._q8_chunks, chunk h * (D/32) + j as the combine stores it), then resets the ticket for
the next launch (a CUDA graph replays the same counters).

How (latency first: this one program is the tail of the kernel): only the splits that hold keys
at this length are read -- [max(L - window, 0) // kps, cdiv(L, kps)), kps the key span per program
the kernel computed -- CH splits a round, each round one load of their max, sum and acc for all
the KV head's query heads (padded to a power of 2, not to the 16 rows of tl.dot) from L2
(.cg: another SM wrote them). The rounds merge online (the running max rescales what came
before), so the first round needs no pass over the maxima first: 2 rounds at d3354 on the 7B
(27 live splits of 32, CH 16), 1 at d16 (split 0 alone). The sums run in another order than the
combine's: the output agrees to float32 rounding, not bit for bit.

Not merged here: the rope-fused kernel (attention.rope_decode_attention) keeps the combine, and
the dispatcher counts that as a fallback of attention.decode.merge.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops.cuda.q8_rows import _q8_chunks

MERGE_SPLITS = 16           # splits a merge round reads (CH), at most ...
MERGE_TILE = 1 << 14        # ... and float32 values a round holds: 128 registers a thread at 4 warps
# (sm_90 build at the 7B's heads, q8 on: 237 registers, no spills; CH 8 took 243, CH 4 165)

_COUNTERS: dict = {}        # device -> this kernel's tickets (not paged_attention's: they reset themselves)


def counters(device, need: int) -> torch.Tensor:
    """The device's ticket counters for the merging decode attention, zero between launches."""
    from minfer.ops.cuda.gemv_repack import GemvWorkspace    # the split-K GEMVs' growable ticket counters

    ws = _COUNTERS.get(device)
    if ws is None:
        ws = _COUNTERS[device] = GemvWorkspace(device)
    return ws.counters(need)


def merge_meta(g: int, n_split: int, bd: int) -> dict:
    """The merge's constexprs: query heads padded to a power of 2 (GM), splits read per round (CH)."""
    gm = triton.next_power_of_2(g)
    ch = min(MERGE_SPLITS, triton.next_power_of_2(n_split), max(1, MERGE_TILE // (gm * bd)))
    return dict(GM=gm, CH=ch)


@triton.jit
def _fold_splits(part_o, part_m, part_l, c0, hi, c, row, gm, d, H, BD: tl.constexpr, mx, num, den):
    """Splits c0 + c (c [CH]; those below hi) of the query heads at offsets row [CH, GM] from a
    split's first (valid where gm) folded into the running max mx [GM], numerator num [GM, BD]
    and denominator den [GM]; one load round. A split without keys (m = -inf) weighs 0. The
    offsets stay int32 and loop-invariant, the split moves the base pointers."""
    cm = (c0 + c < hi)[:, None] & gm[None, :]                             # [CH, GM]
    ms = tl.load(part_m + c0 * H + row, mask=cm, other=float("-inf"), cache_modifier=".cg")
    ls = tl.load(part_l + c0 * H + row, mask=cm, other=0.0, cache_modifier=".cg")
    o = tl.load(part_o + c0 * H * BD + (row[:, :, None] * BD + d[None, None, :]), mask=cm[:, :, None], other=0.0,
                cache_modifier=".cg")                                     # [CH, GM, BD]
    mn = tl.maximum(mx, tl.max(ms, axis=0))
    w = tl.where(ms > float("-inf"), tl.exp(ms - mn[None, :]), 0.0)
    a = tl.where(mx > float("-inf"), tl.exp(mx - mn), 0.0)                 # what came before, rescaled
    num = num * a[:, None] + tl.sum(w[:, :, None] * o, axis=0)
    den = den * a + tl.sum(w * ls, axis=0)
    return mn, num, den


@triton.jit
def merge_tail(part_o, part_m, part_l, out, xq, xf, cnt, kvh, L, kps, window, H, G,
               D: tl.constexpr, BD: tl.constexpr, GM: tl.constexpr, CH: tl.constexpr, Q8: tl.constexpr):
    """Called by every program of _decode_attn_kernel after its partials are stored: the last of
    KV head kvh's programs merges the head's live splits into out (1, H, D) [and xq/xf]."""
    tl.debug_barrier()                        # every thread's partial stores before the release
    ticket = tl.atomic_add(cnt + kvh, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(1) - 1:
        g = tl.arange(0, GM)
        gm = g < G
        qh = kvh * G + g
        d = tl.arange(0, BD)
        lo = tl.maximum(L - window, 0) // kps   # the first split with keys in the window
        hi = tl.cdiv(L, kps)                    # past the last split with keys
        mx = tl.full([GM], float("-inf"), dtype=tl.float32)
        num = tl.zeros([GM, BD], dtype=tl.float32)
        den = tl.zeros([GM], dtype=tl.float32)
        c = tl.arange(0, CH)
        row = c[:, None] * H + qh[None, :]
        for c0 in range(lo, hi, CH):
            mx, num, den = _fold_splits(part_o, part_m, part_l, c0, hi, c, row, gm, d, H, BD, mx, num, den)
        res = num / tl.where(gm, den, 1.0)[:, None]
        tl.store(out + qh[:, None] * D + d[None, :], res.to(out.dtype.element_ty),
                 mask=gm[:, None] & (d < D)[None, :])
        if Q8:
            # the o projection's int8 input, as _combine_kernel writes it (D == BD, D % 32 == 0)
            NC: tl.constexpr = BD // 32
            cc = qh[:, None] * NC + tl.arange(0, NC)[None, :]               # [GM, NC]
            ccm = gm[:, None] & (cc >= 0)
            _q8_chunks(tl.reshape(res, (GM * NC, 32)), tl.reshape(cc, (GM * NC,)), tl.reshape(ccm, (GM * NC,)),
                       xq, xf)
        tl.atomic_xchg(cnt + kvh, 0)            # ready for the next launch (graph replays)
