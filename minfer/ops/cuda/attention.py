"""Causal attention on CUDA over the KV cache (S, Hkv, Dh).

- T > 1 (prefill): from position 0 (bf16/fp16), torch SDPA's cuDNN kernel (FA3-class on
  Hopper), GQA unexpanded, the length rounded up to ops.LENGTH_BUCKET (see sdpa_prefill.cudnn_causal);
  Switches.cudnn_attention=False (MINFER_CUDNN_ATTENTION=0) takes its flash (FA2) kernel instead. After a
  cached prefix: the memory-efficient kernel with an offset causal mask.
- T == 1 (decode): a Triton split-K ('flash-decoding') kernel. Each program takes one KV
  head with all its G query heads (padded to 16 rows for tl.dot) and one range of keys,
  keeps an online softmax, and writes (acc, max, sum) partials; a second kernel merges them
  (with one split, at short lengths, the program writes the output itself).
  The number of keys may come from a device tensor (`n_keys`), so a CUDA graph captured at
  one length replays at any other: the grid is sized from the cache, not the length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.context import DEFAULT, Context
from minfer.ops.cuda.attention_mla import mla_decode_or_none
from minfer.ops.cuda.decode_merge import _grid_merge, grid_merge_ok, merge, nsp, outputs, partials
from minfer.ops.cuda.q8_rows import _q8_chunks
from minfer.ops.cuda.sdpa_prefill import cudnn_causal, masked
from minfer.ops.cuda.pdl import early as pdl_early
from minfer.ops.cuda.pdl import enabled as pdl_enabled
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw


@triton.jit
def _attn_tile(qt, k, v, sm, m_i, l_i, acc, sm_scale, softcap, IEEE: tl.constexpr, CAP: tl.constexpr,
               SAFE: tl.constexpr = False):
    """One tile of keys (k, v [BS, BD], valid where sm) folded into the online softmax (m_i, l_i,
    acc) of the query rows qt [GP, BD]. SAFE: a tile may have no valid key (PIPE: a tile holding
    only this step's row) -- the max then stays -inf and is taken as 0 in the exponents, so the
    tile adds exp(-inf) = 0 instead of NaN; finite maxima give the same values."""
    if IEEE:
        sc = tl.dot(qt, tl.trans(k), input_precision="ieee")
    else:
        sc = tl.dot(qt, tl.trans(k))
    if CAP:
        # gemma2's soft-cap of the scaled scores, softcap * tanh(s / softcap), with
        # tanh(x) = 1 - 2 / (exp(2x) + 1) (exp overflowing to inf gives the limit 1)
        sc = sc * (sm_scale * 2.0 / softcap)
        sc = softcap - 2.0 * softcap / (tl.exp(sc) + 1.0)
        sc = tl.where(sm[None, :], sc, float("-inf"))
    else:
        sc = tl.where(sm[None, :], sc * sm_scale, float("-inf"))       # [GP, BS]
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    m_e = tl.where(m_new > float("-inf"), m_new, 0.0) if SAFE else m_new
    p = tl.exp(sc - m_e[:, None])
    alpha = tl.exp(m_i - m_e)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _fold_score(sc, vr, m_i, l_i, acc, sm_scale, softcap, CAP: tl.constexpr):
    """One key's raw scores sc [GP] (q . k per query row) and its value vr folded into the online
    softmax (m_i, l_i, acc): scaled (or soft-capped) as _attn_tile scales a tile's, the weight
    rounded to the value dtype before it multiplies the value, as the tile's p is for its dot."""
    if CAP:
        sc = sc * (sm_scale * 2.0 / softcap)
        sc = softcap - 2.0 * softcap / (tl.exp(sc) + 1.0)
    else:
        sc = sc * sm_scale
    m_new = tl.maximum(m_i, sc)
    p = tl.exp(sc - m_new)
    alpha = tl.exp(m_i - m_new)
    pv = p.to(vr.dtype).to(tl.float32)[:, None] * vr.to(tl.float32)[None, :]
    return m_new, l_i * alpha + p, acc * alpha[:, None] + pv


@triton.jit
def _kv_tile(kc, vc, s, m, kvh, d, stride_ks, stride_kh, stride_vs, stride_vh, dv=None, mv=None):
    """Keys and values of cache rows s [BS] of KV head kvh, dims d (masked by m: 0), issued
    together: one memory round trip per tile, not two; with dv (masked by mv), the values' dims dv
    only (a V slice, _decode_attn_kernel's VS)."""
    k = tl.load(kc + s[:, None].to(tl.int64) * stride_ks + kvh * stride_kh + d[None, :], mask=m, other=0.0)
    if dv is None:
        v = tl.load(vc + s[:, None].to(tl.int64) * stride_vs + kvh * stride_vh + d[None, :], mask=m, other=0.0)
    else:
        v = tl.load(vc + s[:, None].to(tl.int64) * stride_vs + kvh * stride_vh + dv[None, :], mask=mv, other=0.0)
    return k, v


@triton.jit
def _decode_attn_kernel(q, kc, vc, n_keys, part_o, part_m, part_l, out, xq, xf, bar,
                        stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
                        H, G, sm_scale, window, n_keys_add, softcap,
                        D: tl.constexpr, BD: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr,
                        IEEE: tl.constexpr, PDL: tl.constexpr, CAP: tl.constexpr = False,
                        PRE: tl.constexpr = False, KVPRE: tl.constexpr = False,
                        DIRECT: tl.constexpr = False, Q8: tl.constexpr = False, AHEAD: tl.constexpr = False,
                        GM: tl.constexpr = False, NSP: tl.constexpr = 16, VS: tl.constexpr = 1,
                        PIPE: tl.constexpr = False, SINK: tl.constexpr = False, sinks=None,
                        CHUNK: tl.constexpr = False, chunk=1):
    """VS (Switches.decode_attn_vsplit with one split, decode_attn_split_vs with several): program
    (kvh, sp * VS + vs) computes the scores of its keys over all their dims but the output's dims
    [vs * BD / VS, (vs + 1) * BD / VS) only, reading that slice of V: a key range spread over VS
    SMs (each reads all of K, 1/VS of V). With splits, slice vs of the partial acc; slice 0 stores
    the max and sum (every slice computes the same ones).

    GM (Switches.decode_attn_grid_merge, several splits): after its partials the program
    waits at a grid barrier, then merges chunks of the output itself (decode_merge._grid_merge:
    the combine launch's bits), so no merge launch follows. bar: the barrier's two words.

    DIRECT (a grid of one key split): the program writes the normalized output acc / l
    itself -- and with Q8 its int8 chunks, as the merge would (decode_merge.py) -- instead of partials for a
    merge launch. The same bits as the merge of one split (its weight exp(0) = 1).

    PRE (Switches.decode_attn_preload): the key count and the program's key range are read
    before the PDL wait -- n_keys is the step's position, copied in before its first kernel and
    written by none of them (pdl.py's contract) -- so the cached tiles' loads follow the wait
    directly, not after a dependent load of the count.

    KVPRE (Switches.decode_attn_kvpre, with PRE): the program's first tile of keys/values is
    loaded before the wait as well, its cached rows only (< L - 1: written by earlier steps; row
    L - 1 is this step's, written by the rope + KV kernel just before). After the wait that tile
    is folded in, then the loop over the rest, then row L - 1 alone if it fell inside the first
    tile's span. At d3354 on the 7B (264 programs, 64-key tiles) every program has one tile, so
    all its cache reads overlap the kernels before it.

    PIPE (Switches.decode_attn_pipe, with PRE): the loop over the program's tiles loads each tile's
    cached rows only (all but row L - 1) and takes the PDL wait in its first iteration, after the
    tile loads in program order: the compiler's software pipeline issues the first tiles' cp.async
    copies in the loop's prologue, before the wait (sm_90 PTX: tests/ops/
    test_decode_attn_pipeline_cpu.py), into the same shared-memory stages as the plain loop (unlike
    KVPRE's registers). q and row L - 1's key and value are read after the wait; that row is folded
    in after the tiles (_fold_score).

    SINK (gpt-oss): sinks (H,) float32, each query head's extra softmax logit with no value
    (reference.attention's sinks). Split 0 starts its online softmax from it -- max = sink, sum =
    exp(0) = 1, acc = 0 -- as if it were one more key, so every way out (the direct store, the
    combine launch, the grid merge) divides by exp(sink) + sum exp(s_j) with no change; the
    other splits start empty as before. Split 0 holds it even when the window leaves it no key.

    CHUNK (llama4's chunked layers): the row at p = L - 1 sees keys [lo, L), lo = p // chunk * chunk
    (and L - window: the larger), computed here from the key count (a graph replays at any
    position); the splits divide [lo, L) instead of [0, L), so no program visits a tile before lo."""
    if not PRE:
        pdl_enter(PDL)   # ops/cuda/pdl.py: q and the cache rows come from the kernels just before
    kvh = tl.program_id(0)
    DV: tl.constexpr = BD // VS
    if VS > 1:                                           # the grid's second axis: key splits x V slices
        vs = tl.program_id(1) % VS
        sp = tl.program_id(1) // VS
        n_splits = tl.num_programs(1) // VS
    else:
        vs = 0
        sp = tl.program_id(1)
        n_splits = tl.num_programs(1)
    L = tl.load(n_keys) + n_keys_add
    # the keys split evenly over the grid's programs at THIS length (a graph's grid is sized for
    # the whole cache; a split fixed at capture would leave most programs empty at short
    # lengths and few, long ones at depth), whole BS tiles per program
    if CHUNK:     # the row's own chunk (llama.cpp is_masked_swa, LLAMA_SWA_TYPE_CHUNKED) split from its start
        lo = tl.maximum((L - 1) // chunk * chunk, L - window)
        kps = tl.cdiv(tl.cdiv(L - lo, n_splits), BS) * BS
        s0 = lo + sp * kps
        s1 = tl.minimum(s0 + kps, L)
    else:
        kps = tl.cdiv(tl.cdiv(L, n_splits), BS) * BS
        s1 = tl.minimum(sp * kps + kps, L)
        s0 = tl.maximum(sp * kps, L - window)            # sliding window: the last `window` keys
    g = tl.arange(0, GP)
    gm = g < G
    qh = kvh * G + g
    d = tl.arange(0, BD)
    dm = d < D
    dv = vs * DV + tl.arange(0, DV)
    dvm = dv < D
    if KVPRE:
        cend = tl.minimum(s1, L - 1)                     # the first tile's cached rows
        s = s0 + tl.arange(0, BS)
        sa = s < cend
        ka, va = _kv_tile(kc, vc, s, sa[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh)
    if SINK:
        m_i = tl.load(sinks + qh, mask=gm & (sp == 0), other=float("-inf")).to(tl.float32)
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
    else:
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, DV], dtype=tl.float32)
    first = s0
    if PIPE:
        # every tile's cached rows -- all but this step's row L - 1, written by the rope + KV kernel
        # just before -- are loaded by the loop's pipelined copies, whose first stages go out before
        # the wait; the first iteration takes the wait, then reads q and row L - 1's key and value,
        # which are folded in after the tiles (_fold_score): the same softmax over the same keys,
        # row L - 1 last instead of in its tile (float32 rounding apart from the plain loop)
        r = L - 1
        mine = (r >= s0) & (r < s1)
        qt = tl.zeros([GP, BD], dtype=q.dtype.element_ty)
        kr = tl.zeros([BD], dtype=kc.dtype.element_ty)
        vr = tl.zeros([DV], dtype=vc.dtype.element_ty)
        for start in range(s0, s1, BS):
            s = start + tl.arange(0, BS)
            cm = (s < s1) & (s != r)
            k, v = _kv_tile(kc, vc, s, cm[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh,
                            dv, cm[:, None] & dvm[None, :])
            if start == s0:
                pdl_enter(PDL)
                qt = tl.load(q + qh[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
                kr = tl.load(kc + r.to(tl.int64) * stride_ks + kvh * stride_kh + d, mask=dm & mine, other=0.0)
                vr = tl.load(vc + r.to(tl.int64) * stride_vs + kvh * stride_vh + dv, mask=dvm & mine, other=0.0)
            m_i, l_i, acc = _attn_tile(qt, k, v, cm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP, True)
        if s1 <= s0:                                     # an empty split: its loop took no wait
            pdl_enter(PDL)
        if mine:      # its score in float32, a sum of products (not the tile's dot)
            sc = tl.sum(qt.to(tl.float32) * kr.to(tl.float32)[None, :], axis=1)     # [GP]
            m_i, l_i, acc = _fold_score(sc, vr, m_i, l_i, acc, sm_scale, softcap, CAP)
        first = s1
    else:
        if PRE:
            pdl_enter(PDL)   # q and this step's cache row come from the kernels just before
        qt = tl.load(q + qh[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
    if KVPRE:
        if s0 < cend:
            m_i, l_i, acc = _attn_tile(qt, ka, va, sa, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
        first = s0 + BS
    if AHEAD:
        # the next tile's keys/values loaded into registers before this tile's math: slower on the
        # H200 (graph +3..+26 us, perf-log Z4); it turns off Triton's own cp.async pipeline of the
        # plain loop (perf-log Z8), hence off. Past s1 the loads are masked off.
        s = first + tl.arange(0, BS)
        sm = s < s1
        k, v = _kv_tile(kc, vc, s, sm[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh)
        for start in range(first, s1, BS):
            sn = start + BS + tl.arange(0, BS)
            smn = sn < s1
            kn, vn = _kv_tile(kc, vc, sn, smn[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs,
                              stride_vh)
            m_i, l_i, acc = _attn_tile(qt, k, v, sm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
            k, v, sm = kn, vn, smn
    else:
        for start in range(first, s1, BS):
            s = start + tl.arange(0, BS)
            sm = s < s1
            # V issued with K, before the scores need K (at depth most programs have a single tile)
            k, v = _kv_tile(kc, vc, s, sm[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh,
                            dv, sm[:, None] & dvm[None, :])
            m_i, l_i, acc = _attn_tile(qt, k, v, sm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
    if KVPRE:
        r = L - 1
        if (r >= s0) & (r < s1) & (r < s0 + BS):
            # this step's row, inside the preloaded tile's span: read after the wait, alone
            s = r + tl.arange(0, BS)
            sm = s == r
            k, v = _kv_tile(kc, vc, s, sm[:, None] & dm[None, :], kvh, d, stride_ks, stride_kh, stride_vs, stride_vh)
            m_i, l_i, acc = _attn_tile(qt, k, v, sm, m_i, l_i, acc, sm_scale, softcap, IEEE, CAP)
    if DIRECT:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out + qh[:, None] * D + dv[None, :], res.to(out.dtype.element_ty), mask=gm[:, None] & dvm[None, :])
        if Q8:
            # the o projection's int8 input (gemv_q8's form), chunk h * D/32 + j of head h (D == BD;
            # this program's V slice: chunks vs * DV/32 ..)
            NC: tl.constexpr = GP * DV // 32
            j = tl.arange(0, DV // 32)
            cc = tl.reshape(qh[:, None] * (BD // 32) + vs * (DV // 32) + j[None, :], (NC,))
            cm = tl.reshape(gm[:, None] & (j < DV // 32)[None, :], (NC,))
            _q8_chunks(tl.reshape(res, (NC, 32)), cc, cm, xq, xf)
    else:
        tl.store(part_o + (sp * H + qh[:, None]) * BD + dv[None, :], acc, mask=gm[:, None] & dvm[None, :])
        if vs == 0:
            tl.store(part_m + sp * H + qh, m_i, mask=gm)
            tl.store(part_l + sp * H + qh, l_i, mask=gm)
        if GM:
            _grid_merge(part_o, part_m, part_l, out, xq, xf, bar, H, tl.program_id(1) * tl.num_programs(0) + kvh,
                        tl.num_programs(0) * tl.num_programs(1), n_splits, D, BD, NSP, Q8)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_keys,
                     n_split: int | None = None, window: int = 0, q8: bool = False, n_keys_add: int = 0,
                     pdl: int = 0, programs: int = 264, softcap: float = 0.0, pre: bool = False,
                     kvpre: bool = False, direct: bool = True, warps: int = 4, ahead: bool = False,
                     tiles: int = 2, grid_merge: bool = False, bar: torch.Tensor | None = None,
                     vsplit: int = 4, split_vs: int = 1, pipe: bool = False, combine_chunk: int = 32,
                     combine_pdl: int | None = None, sinks: torch.Tensor | None = None,
                     scale: float | None = None, chunk: int = 0) -> torch.Tensor:
    """q (1, H, Dh) attending keys [0, n_keys) of the caches (S, Hkv, Dh) -> (1, H, Dh), scores times
    `scale` (default 1/sqrt(Dh)); with
    window > 0 only keys [n_keys - window, n_keys) (splits below it are empty and weigh 0);
    chunk > 0 (llama4) only keys [(n_keys - 1) // chunk * chunk, n_keys), the splits dividing those
    (the kernel's CHUNK variant: the start from the device count, no host value);
    softcap > 0 (gemma2): scores s -> softcap * tanh(s / softcap) (the kernel's CAP variant).
    sinks (H,) (gpt-oss): each head's extra softmax logit (the kernel's SINK variant).

    n_keys: int, or an int32/int64 (1,) device tensor (graph capture: the value may change
    between replays; the grid covers the whole cache), plus n_keys_add (the kernel adds it: a
    graph passes its position tensor and 1, not a torch add kernel per layer). pdl: pdl.py.
    pre: the key count read before the PDL wait (_decode_attn_kernel's PRE); kvpre: also the
    first tile of cached keys/values (KVPRE; implies pre). direct: with one key split (a span of
    up to two key tiles: a short cache, or a graph captured over a short view of one, see
    runtime/cuda_graphs.py) the kernel writes the output itself, no merge launch (False: the
    partials and the combine launch, decode_merge.py, for tests). warps: the kernel's num_warps
    (Switches.decode_attn_warps); twice that with one split in one program a KV head (its 4
    programs are the whole grid: 8 warps measured -9 / -5 us a 7B step at positions 16 / 64,
    perf-log Z2), the value itself with V slices (vsplit > 1: 4 warps at VS 4 measured -9..-13 us
    against 8, perf-log AA5).
    ahead (Switches.decode_attn_ahead): each program loads its next key tile before the math of
    this one (_decode_attn_kernel AHEAD); the split kernel then takes at least 8 warps, as measured
    (the reason given then, a spill at 4, came from a build without the launch's divisibility
    hints: with them neither spills, and the lookahead turns Triton's cp.async pipeline off,
    perf-log Z8). tiles (Switches.decode_attn_tiles): the fewest key tiles a
    split program covers at the cache's full length (_n_split). grid_merge
    (Switches.decode_attn_grid_merge): with several splits the attention's programs merge them
    after a grid barrier (decode_merge.py) instead of a combine launch, where that is safe (at
    most one program an SM, Dh a multiple of 32, not the interpreter; counted
    `attention.decode.grid_merge`, a fallback otherwise); bar: its two int32 words (zeros; the
    workspace's `attn_barrier()`, a fresh pair when None). vsplit (Switches.decode_attn_vsplit):
    with one split, each KV head's program is spread over this many programs by V's dims
    (_decode_attn_kernel VS; 1, 2 or 4, slices of at least 32 dims; not with kvpre or ahead; H200,
    7B short graph: 4 slices at 4 warps -35 / -40 / -42 us at positions 24 / 72 / 108, perf-log AA5);
    split_vs (Switches.decode_attn_split_vs): the same for each key split of the split kernel
    (slices of at least 16 dims). pipe (Switches.decode_attn_pipe; implies pre, not with kvpre or
    ahead): every tile's cached rows in a loop whose first iteration takes the PDL wait, so their
    pipelined copies start before it; this step's row after it, folded in last (_decode_attn_kernel
    PIPE). combine_chunk (Switches.decode_combine_chunk): the values a combine program merges
    (decode_merge.merge); combine_pdl: the combine launch's PDL mode (None: pdl's; pdl.early's
    combine role).
    """
    if warps not in (1, 2, 4, 8, 16):
        raise MinferError(f"MINFER_DECODE_ATTN_WARPS={warps}: the decode attention's warps per program must be "
                          "1, 2, 4, 8 or 16")
    _, h, dh = q.shape
    s_max, hkv, _ = k_cache.shape
    g = h // hkv
    bs = _key_tile(q)
    if isinstance(n_keys, torch.Tensor):
        span = s_max
        nk = n_keys.reshape(1)
    else:
        span = int(n_keys) + n_keys_add
        n_keys_add = 0
        nk = torch.full((1,), span, dtype=torch.int32, device=q.device)
    chunk = max(0, int(chunk))
    # a chunked row reads at most chunk keys (its chunk's start to its position): the splits cover those
    n_split = _n_split(min(span, chunk) if chunk else span, bs, hkv, programs, n_split, tiles)
    bd = max(16, triton.next_power_of_2(dh))   # tl.dot's K is at least 16 (a head of 8 is padded, masked)
    direct = n_split == 1 and direct
    if vsplit not in (1, 2, 4):
        raise MinferError(f"MINFER_DECODE_ATTN_VSPLIT={vsplit}: the one-split decode attention's V slices must be "
                          "1, 2 or 4")
    if split_vs not in (1, 2, 4):
        raise MinferError(f"MINFER_DECODE_ATTN_SPLIT_VS={split_vs}: the split decode attention's V slices must be "
                          "1, 2 or 4")
    pipe = bool(pipe) and not (kvpre or ahead)
    if direct:
        vs = vsplit if not (kvpre or ahead) and bd == dh and (bd // vsplit) % 32 == 0 else 1
    else:
        vs = split_vs if not (kvpre or ahead) and (bd // split_vs) >= 16 else 1
        if vs > 1:
            paths.count(f"attention.decode.split.v{vs}")
    if direct:      # one split: the kernel writes the output (and its q8 form), no merge launch
        paths.count("attention.decode.one_split")
        if vs > 1:
            paths.count(f"attention.decode.one_split.v{vs}")
        out, xq, xf, q8 = outputs(q.dtype, h, dh, bd, q8, q.device)
    else:
        part_o, part_m, part_l = partials(n_split, h, bd, q.device)
        grid_merge = grid_merge and grid_merge_ok(q.device, hkv * n_split * vs, dh, bd)
        if grid_merge:
            out, xq, xf, q8 = outputs(q.dtype, h, dh, bd, q8, q.device)
            if bar is None:
                bar = torch.zeros(2, dtype=torch.int32, device=q.device)
    q2 = q.reshape(h, dh)
    if q2.stride(-1) != 1:
        q2 = q2.contiguous()
    kc, vc = k_cache, v_cache
    if kc.dtype != q2.dtype:
        q2 = q2.to(kc.dtype)
    if direct:                             # the pointers a build does not use: any tensor
        part_o = part_m = part_l = out
        xq, xf = (xq, xf) if q8 else (out, out)
    elif grid_merge:
        xq, xf = (xq, xf) if q8 else (part_m, part_m)
    else:
        out = xq = xf = part_m
    if not grid_merge:
        bar = part_m
    _decode_attn_kernel[(hkv, n_split * vs)](
        q2, kc, vc, nk, part_o, part_m, part_l, out, xq, xf, bar, q2.stride(0), kc.stride(0), kc.stride(1),
        vc.stride(0), vc.stride(1), h, g, 1.0 / dh ** 0.5 if scale is None else float(scale),
        window if window > 0 else 1 << 30, n_keys_add,
        float(softcap) if softcap > 0 else 1.0,
        D=dh, BD=bd, GP=max(16, triton.next_power_of_2(g)), BS=bs, IEEE=kc.dtype == torch.float32, PDL=pdl,
        CAP=softcap > 0, PRE=bool(pre or kvpre or pipe), KVPRE=bool(kvpre), DIRECT=direct, Q8=(direct or grid_merge) and q8,
        AHEAD=bool(ahead), GM=grid_merge, NSP=nsp(n_split), VS=vs, PIPE=pipe, SINK=sinks is not None,
        sinks=None if sinks is None else sinks.float().contiguous(), CHUNK=chunk > 0, chunk=max(chunk, 1),
        num_warps=(2 * warps if vs == 1 else warps) if direct else (max(8, warps) if ahead else warps),
        **launch_kw(pdl))
    if direct or grid_merge:
        if q8:
            out.q8 = (xq, xf)
        return out
    return merge(part_o, part_m, part_l, n_split, q.dtype, h, dh, q8, pdl if combine_pdl is None else combine_pdl,
                 combine_chunk)


def _n_split(span: int, bs: int, hkv: int, programs: int, n_split: int | None, tiles: int = 2) -> int:
    """Key ranges per KV head for a grid covering `span` keys."""
    if n_split is None:
        # enough programs to cover the SMs, at least `tiles` tiles of keys per program at the
        # longest length (Switches.decode_attn_tiles; one tile each measured 0.94x at d3354 on the
        # H200 in an early session, perf-log); the kernel divides the keys of each call's actual
        # length over them. Up to two tiles stay one split whatever `tiles` says (the short
        # graph's direct kernel, one_split_rows).
        per = 2 if span <= 2 * bs else max(1, tiles)
        n_split = max(1, min(triton.cdiv(span, per * bs), triton.cdiv(programs, hkv)))
    return max(1, min(n_split, triton.cdiv(span, bs)))


def _key_tile(q) -> int:
    # key tiles: K and V of a tile are both staged (3 pipeline stages), so a 256-wide head takes
    # 32 keys a tile (64 needed 276 KiB of shared memory, over the H200's 227 KiB)
    return 16 if q.device.type == "cpu" else _cuda_key_tile(q.shape[-1])


def _cuda_key_tile(dh: int) -> int:
    return 64 if dh <= 128 else 32


def one_split_rows(head_dim: int) -> int:
    """The most cache rows a single-sequence decode attention (on CUDA) covers with one key
    split -- two key tiles -- so that it writes its output without a merge launch."""
    return 2 * _cuda_key_tile(head_dim)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos,
              ctx: Context | None = None, window: int = 0, softcap: float = 0.0, sinks=None,
              scale: float | None = None, chunk: int = 0, alibi=None) -> torch.Tensor:
    """q (T, H, Dh) at positions start_pos.. over caches (S, Hkv, Dh), causal -> (T, H, Dh).

    start_pos: int, or (decode under a CUDA graph) a (1,) int device tensor holding it.
    window > 0 (sliding-window layers): decode reads only the last `window` keys
    (attention.window.decode); T > 1 takes the masked kernel with the window in its mask
    (attention.window.masked), since the cuDNN and flash paths are causal-only.
    softcap > 0 (gemma2's soft-capped scores): decode takes the same kernel with the cap
    (attention.softcap[.window].decode); T > 1 writes the scores out in torch
    (attention.softcap.torch: SDPA's fused kernels have no score hook).
    sinks (H,) (gpt-oss's per-head sink logits): decode takes the same kernel's SINK variant;
    T > 1 the torch path with the sinks (attention.sinks.torch), for the same reason.
    scale: the scores' factor (None: 1/sqrt(Dh)); the decode kernel and SDPA take it as is.
    chunk > 0 (llama4's chunked layers): a query at p sees keys p // chunk * chunk <= j <= p; decode
    takes the same kernel's CHUNK variant (attention.chunked.decode: only the row's chunk is read, the
    start from the device position), T > 1 the torch path (attention.chunked.torch; llama4 cuts its
    host-positioned steps at the chunk boundaries instead, models/llama4.py).
    A v_cache narrower than the keys (deepseek2's latent cache: keys of kv_lora + rope dims, 576 in
    V3, values their first kv_lora dims, one KV head for all 128 query heads): at T = 1 the MLA
    kernel of attention_mla.py (attention.mla.decode.triton; what it refuses is a counted fallback),
    T > 1 the torch path (_softcapped; counted attention.mla.torch): SDPA's fused kernels take at
    most 256 dims.
    alibi (H,) (bloom, mpt: ALiBi slopes, - m_h |p - j| added to the scores): any T in torch, counted
    attention.alibi.torch (no kernel has the bias yet).
    """
    sw = (ctx or DEFAULT).switches
    t, h, dh = q.shape
    if alibi is not None:
        return _softcapped(q, k_cache, v_cache, start_pos, window, softcap, sinks, scale, "attention.alibi.torch",
                           chunk, alibi)
    if v_cache.shape[-1] != dh:
        if t == 1:    # deepseek2's latent cache: attention_mla.py's kernel (attention.mla.decode.triton)
            out = mla_decode_or_none(q, k_cache, v_cache, start_pos, sw, window, softcap, sinks, scale)
            if out is not None:
                return out
        return _softcapped(q, k_cache, v_cache, start_pos, window, softcap, sinks, scale, "attention.mla.torch")
    if t == 1 and sw.decode_attention:
        if softcap > 0 or window > 0 or chunk > 0:
            paths.count("attention" + ".softcap" * (softcap > 0) + ".window" * (window > 0) + ".chunked" * (chunk > 0)
                        + ".decode")
        else:
            paths.count("attention.decode.triton")
        q8 = q.dtype != torch.float32 and sw.gemv_q8
        pdl = pdl_enabled(sw, q.device, "decode_attention", early_ok=True)
        return decode_attention(q, k_cache, v_cache, start_pos, window=window, q8=q8, n_keys_add=1,
                                pdl=pdl, combine_pdl=pdl_early(sw, pdl, "combine"),
                                programs=sw.decode_attn_programs, softcap=softcap, pre=sw.decode_attn_preload,
                                kvpre=sw.decode_attn_kvpre, warps=sw.decode_attn_warps, ahead=sw.decode_attn_ahead,
                                tiles=sw.decode_attn_tiles, vsplit=sw.decode_attn_vsplit,
                                split_vs=sw.decode_attn_split_vs, pipe=sw.decode_attn_pipe,
                                combine_chunk=sw.decode_combine_chunk,
                                grid_merge=sw.decode_attn_grid_merge,
                                bar=ctx.workspace.attn_barrier() if sw.decode_attn_grid_merge and ctx is not None
                                and ctx.workspace is not None else None, sinks=sinks, scale=scale, chunk=chunk)
    if t == 1:
        paths.switched_off("attention.decode.triton", "MINFER_DECODE_ATTN")
    if isinstance(start_pos, torch.Tensor):
        start_pos = int(start_pos.item())
    s = start_pos + t
    hkv = k_cache.shape[1]
    scale = 1.0 / dh ** 0.5 if scale is None else float(scale)
    if softcap > 0 or sinks is not None or chunk > 0:
        return _softcapped(q, k_cache, v_cache, start_pos, window, softcap, sinks, scale,
                           "attention.chunked.torch" if chunk > 0 else None, chunk)
    if window > 0:
        return masked(q, k_cache, v_cache, start_pos, scale, window, "attention.window.masked")
    if start_pos == 0 and q.dtype in (torch.float16, torch.bfloat16) and sw.cudnn_attention:
        # cuDNN's fused attention (FA3-class on Hopper): half the flash (FA2) kernel's time
        try:
            return cudnn_causal(q, k_cache, v_cache, scale)
        except RuntimeError as e:
            paths.fallback("attention.prefill.cudnn", f"SDPA refused cuDNN: {str(e).splitlines()[0][:80]}")
    elif start_pos == 0 and not sw.cudnn_attention:
        paths.switched_off("attention.prefill.cudnn", "MINFER_CUDNN_ATTENTION")
    # SDPA's fused kernels take 4-D (B, H, T, Dh) inputs only: with 3-D inputs it silently uses
    # its math backend, which upcasts bf16 to float32 and materializes the (T, S) scores
    # (docs/perf-log.md section 8). So: 4-D, the math backend excluded, and a refusal counted as
    # a fallback.
    k = k_cache[:s].transpose(0, 1).unsqueeze(0)            # (1, Hkv, S, Dh)
    v = v_cache[:s].transpose(0, 1).unsqueeze(0)
    qh = q.transpose(0, 1).unsqueeze(0)                      # (1, H, T, Dh)
    if k.dtype != qh.dtype:
        k, v = k.to(qh.dtype), v.to(qh.dtype)
    if start_pos == 0 and qh.dtype in (torch.float16, torch.bfloat16):
        # causal from position 0: flash attention, GQA without expanding k/v
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale,
                                                     enable_gqa=hkv != h)
            paths.count("attention.prefill.flash")
            return out[0].transpose(0, 1)                    # (T, H, Dh)
        except RuntimeError as e:
            paths.fallback("attention.prefill.flash", f"SDPA refused flash: {str(e).splitlines()[0][:80]}")
    # a cached prefix (start_pos > 0): the causal mask is offset, which flash cannot take
    return masked(q, k_cache, v_cache, start_pos, scale, 0, "attention.prefill.masked")


SOFTCAP_SCORE_BYTES = 1 << 28   # the float32 (H, rows, S) scores of one chunk of query rows


def _softcapped(q, k_cache, v_cache, start_pos, window: int, softcap: float, sinks=None, scale=None,
                path: str | None = None, chunk: int = 0, alibi=None):
    """T > 1 with soft-capped scores (gemma2) or sinks (gpt-oss, attention.sinks.torch) or a chunk
    (llama4, attention.chunked.torch), and any T
    with values narrower than the keys (deepseek2, path attention.mla.torch):
    reference.softcapped_attention on the device in
    float32, the query rows in chunks that keep the written-out scores under
    SOFTCAP_SCORE_BYTES. Slower than the fused kernels and counted apart
    (attention.softcap.torch); exact up to float32 rounding. start_pos a device tensor (one
    decode row under a CUDA graph): every cache row, those past the position masked (no host value)."""
    from minfer.ops.reference import alibi_bias, softcapped_attention

    t, h, dh = q.shape
    if isinstance(start_pos, torch.Tensor) and t > 1:
        start_pos = int(start_pos.item())
    s = k_cache.shape[0] if isinstance(start_pos, torch.Tensor) else start_pos + t
    k = k_cache[:s].transpose(0, 1).float()                  # (Hkv, S, Dh)
    v = v_cache[:s].transpose(0, 1).float()                  # (Hkv, S, Dv)
    qh = q.transpose(0, 1).float()                           # (H, T, Dh)
    j = torch.arange(s, device=q.device)[None, :]
    rows = max(1, SOFTCAP_SCORE_BYTES // (4 * h * s))
    out = torch.empty((t, h, v.shape[-1]), dtype=q.dtype, device=q.device)
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        p = (start_pos + torch.arange(r0, r1, device=q.device))[:, None]
        mask = j <= p                                        # (rows, S)
        if window > 0:
            mask = mask & (p - j < window)                   # llama.cpp is_masked_swa (STANDARD)
        if chunk > 0:
            mask = mask & (j >= torch.div(p, chunk, rounding_mode="floor") * chunk)      # (CHUNKED)
        bias = None if alibi is None else alibi_bias(alibi, p[:, 0], s)     # ALiBi (H, rows, S)
        o = softcapped_attention(qh[:, r0:r1], k, v, mask, softcap, sinks, scale, bias)   # (H, rows, Dv)
        out[r0:r1] = o.transpose(0, 1).to(q.dtype)
    paths.count(path or ("attention.softcap.torch" if softcap > 0 else "attention.sinks.torch"))
    return out
