"""The merge of the one-token decode attention's key splits (ops/cuda/attention.py).

Each split program of _decode_attn_kernel leaves (acc, max, sum) partials per query head; the
head's output is sum_s w_s acc_s / sum_s w_s l_s with w_s = exp(m_s - max m) (the online
softmax's merge; empty splits, m = -inf, weigh 0). Two ways to run it:

- the combine launch (_combine_kernel): one program per (head, 32-value chunk), after the
  attention grid has completed;
- the grid merge (Switches.decode_attn_grid_merge): the attention's own programs, after a grid
  barrier (_grid_barrier: every program has stored its partials), merge the chunks themselves,
  chunk c by program c mod P. No launch, no wait for a grid to drain and a new one to start.
  A barrier inside a grid is only safe when all its programs can be resident at once, so the
  caller takes it only with at most one program per SM (attention.decode_attention), and never
  under Triton's interpreter (it runs programs one after another: the first would wait forever).

Both call _merge_chunk with the same shapes and warps, so they write the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.ops import paths
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw
from minfer.ops.cuda.q8_rows import _q8_chunks


@triton.jit
def _merge_chunk(part_o, part_m, part_l, out, xq, xf, H, NS, h, j, D: tl.constexpr, BD: tl.constexpr,
                 DC: tl.constexpr, NSP: tl.constexpr, Q8: tl.constexpr, CG: tl.constexpr):
    """Values [j*DC, (j+1)*DC) of head h merged over the NS splits, every split's m, l and
    partials read in one round (NSP >= NS: no loop of dependent loads; the merge was
    latency-bound when it looped over the splits 16 at a time). CG: the loads bypass L1 (the
    grid merge reads partials other SMs wrote during this kernel)."""
    c = tl.arange(0, NSP)
    cm = c < NS
    d = j * DC + tl.arange(0, DC)
    if CG:
        ms = tl.load(part_m + c * H + h, mask=cm, other=float("-inf"), cache_modifier=".cg")
        ls = tl.load(part_l + c * H + h, mask=cm, other=0.0, cache_modifier=".cg")
        o = tl.load(part_o + (c * H + h)[:, None] * BD + d[None, :], mask=cm[:, None], other=0.0,
                    cache_modifier=".cg")
    else:
        ms = tl.load(part_m + c * H + h, mask=cm, other=float("-inf"))
        ls = tl.load(part_l + c * H + h, mask=cm, other=0.0)
        o = tl.load(part_o + (c * H + h)[:, None] * BD + d[None, :], mask=cm[:, None], other=0.0)
    M = tl.max(ms, axis=0)
    live = ms > float("-inf")
    w = tl.where(live, tl.exp(ms - M), 0.0)
    res = tl.sum(o * w[:, None], axis=0) / tl.sum(w * ls, axis=0)
    tl.store(out + h * D + d, res.to(out.dtype.element_ty), mask=d < D)
    if Q8:
        # the o projection's int8 input (gemv_q8's form): this chunk's DC // 32 chunks of 32 values
        # (DC a multiple of 32, D == BD)
        CQ: tl.constexpr = DC // 32
        cc = h * (D // 32) + j * CQ + tl.arange(0, CQ)
        _q8_chunks(tl.reshape(res, (CQ, 32)), cc, cc < H * (D // 32), xq, xf)


@triton.jit
def _combine_kernel(part_o, part_m, part_l, out, xq, xf, H, NS, D: tl.constexpr, BD: tl.constexpr, DC: tl.constexpr,
                    NSP: tl.constexpr, Q8: tl.constexpr, PDL: tl.constexpr):
    """The merge as its own launch: program (h, j) does values [j*DC, (j+1)*DC) of head h."""
    pdl_enter(PDL)
    _merge_chunk(part_o, part_m, part_l, out, xq, xf, H, NS, tl.program_id(0), tl.program_id(1),
                 D, BD, DC, NSP, Q8, False)


@triton.jit
def _grid_barrier(bar, P):
    """Every one of the grid's P programs waits here until all P have arrived; their stores
    before it are visible to all after it. bar: two int32 words, (arrivals, generation), zero
    arrivals between launches (the last to arrive resets them), so graph replays reuse them.

    The generation is read before arriving: it cannot move before this program has arrived.
    The CTA barrier first orders every thread's partial stores before the one thread's
    acq_rel arrival (the paged attention's ticket does the same); the last arrival, which has
    acquired every other's release, bumps the generation with a release, and the waiters'
    acquire of the new generation makes all partials visible to them."""
    tl.debug_barrier()
    gen = tl.atomic_add(bar + 1, 0, sem="relaxed", scope="gpu")
    old = tl.atomic_add(bar, 1, sem="acq_rel", scope="gpu")
    if old == P - 1:
        tl.atomic_xchg(bar, 0, sem="relaxed", scope="gpu")          # ready for the next launch
        tl.atomic_add(bar + 1, 1, sem="release", scope="gpu")
    else:
        cur = gen
        while cur == gen:
            cur = tl.atomic_add(bar + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _grid_merge(part_o, part_m, part_l, out, xq, xf, bar, H, pid, P, NS, D: tl.constexpr, BD: tl.constexpr,
                NSP: tl.constexpr, Q8: tl.constexpr):
    """After the barrier, program pid of P merges chunks pid, pid + P, ... of the H * D / 32
    (D == BD, 32 values a chunk: the combine launch's programs, same bits)."""
    _grid_barrier(bar, P)
    NCH = H * (D // 32)
    for c in range(pid, NCH, P):
        _merge_chunk(part_o, part_m, part_l, out, xq, xf, H, NS, c // (D // 32), c % (D // 32),
                     D, BD, 32, NSP, Q8, True)


def outputs(dtype, h: int, dh: int, bd: int, q8: bool, device) -> tuple:
    """The attention's output (1, H, Dh) and, where the o projection takes it (q8 and the
    shape allows), its int8 words and chunk scales (gemv_q8.py's form): (out, xq, xf, q8);
    xq, xf are None without q8."""
    out = torch.empty((1, h, dh), dtype=dtype, device=device)
    q8 = q8 and dh == bd and dh % 32 == 0 and (h * dh) % 256 == 0
    xq = torch.empty(h * dh // 4, dtype=torch.int32, device=device) if q8 else None
    xf = torch.empty(h * dh // 8, dtype=torch.float32, device=device) if q8 else None
    return out, xq, xf, q8


def partials(n_split: int, h: int, bd: int, device) -> tuple:
    """Each split's (acc, max, sum) per query head."""
    return (torch.empty((n_split, h, bd), dtype=torch.float32, device=device),
            torch.empty((n_split, h), dtype=torch.float32, device=device),
            torch.empty((n_split, h), dtype=torch.float32, device=device))


def nsp(n_split: int) -> int:
    """The merge's split tile (one load round over every split)."""
    return max(16, triton.next_power_of_2(n_split))


# the combine launch's warps a program (a measuring knob for tools/skip_oracle.py's combine_warps:N, not a switch)
COMBINE_WARPS = 4


def merge(part_o, part_m, part_l, n_split: int, dtype, h: int, dh: int, q8: bool, pdl: int,
          chunk: int = 32) -> torch.Tensor:
    """The splits' partials merged by the combine launch -> (1, H, Dh) in dtype; q8: with the
    row's int8 form attached as out.q8 (gemv_q8.py; layers.merge_heads keeps it). chunk
    (Switches.decode_combine_chunk): the values a program merges (32, 64 or 128: H * Dh / chunk
    programs), where the padded head dim is a multiple of it."""
    bd = part_o.shape[-1]
    out, xq, xf, q8 = outputs(dtype, h, dh, bd, q8, part_o.device)
    if not q8:
        xq = xf = part_m
    if chunk not in (32, 64, 128):
        from minfer.errors import MinferError

        raise MinferError(f"MINFER_DECODE_COMBINE_CHUNK={chunk}: the combine's values a program must be 32, 64 "
                          "or 128")
    dc = chunk if bd % chunk == 0 else 32 if bd % 32 == 0 else bd
    _combine_kernel[(h, bd // dc)](part_o, part_m, part_l, out, xq, xf, h, n_split, D=dh, BD=bd, DC=dc,
                                   NSP=nsp(n_split), Q8=q8, PDL=pdl, num_warps=COMBINE_WARPS, **launch_kw(pdl))
    if q8:
        out.q8 = (xq, xf)
    return out


_sm_count: dict = {}


def grid_merge_ok(device, programs: int, dh: int, bd: int) -> bool:
    """Whether a grid of `programs` split programs can merge after a barrier: all of them resident
    at once (at most one an SM, whatever else the SMs hold), 32-value chunks inside one head, and
    real concurrency (Triton's interpreter runs programs one by one: not taken, not counted)."""
    from minfer.ops.cuda.dequant import interpret

    if interpret() or device.type != "cuda":
        return False
    if dh != bd or dh % 32:
        paths.fallback("attention.decode.grid_merge", f"head dim {dh} is not a power of two of at least 32")
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = _sm_count.get(idx)
    if sms is None:
        sms = _sm_count[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    if programs > sms:
        paths.fallback("attention.decode.grid_merge", f"{programs} split programs > {sms} SMs (a grid barrier "
                       "needs them all resident)")
        return False
    paths.count("attention.decode.grid_merge")
    return True
