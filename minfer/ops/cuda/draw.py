"""The single engine's token choice on CUDA in two or three kernel launches (runtime/device_draw.DeviceDraw).

batch_sampling.sample_rows and the read-back draw one row in 27 GPU kernels and copies when greedy
(argmax, the NaN and +inf checks, logsumexp for the logprob, the casts) and 126 with top-k 40 (the
order keys, torch.topk's passes over the vocabulary, softmax, cumsum, the masks, the hash): each
tiny, each launched by the host between two decode steps (tools/draw_prof.py on the H200: 50 /
210 us of GPU time, 0.3 / 2.4 ms of host time a draw). Here greedy is two launches and sampled
three when the vocabulary has more than G chunks (else two):

  _chunk_kernel  one program per CH logits (4096 greedy, 2048 sampled): their NaN / +inf flags,
                 max and sum of exp(x - max) (the logsumexp's partials), and the first index of
                 their max (greedy) or their KB largest order keys (sampled:
                 batch_sampling._order_keys, tl.topk);
  _merge_kernel  sampled, one program per G = MERGE_KEYS // KB chunks: the KB largest of their
                 G * KB keys, so the final kernel sorts cdiv(P, G) * KB candidates, not P * KB;
  _final_kernel  one program: the row's flags, logsumexp and token; sampled, the KB largest of the
                 candidates are the row's top-k in a stable descending order, and the filters and
                 the Gumbel-max draw run on them as batch_sampling._filter_draw does; it writes
                 [token, logprob, NaN flag, +inf flag] (float64) and the token (int64) for the
                 next step launched from the device.

Measured on the H200 at V = 152,064 (tools/draw_prof.py --variants, the kernels' GPU time a draw,
perf-log AH2): greedy 5.6 us (AG3). Sampled, before the merge stage (4096-logit chunks, two
launches): top-k 40 49.2 us (the chunk kernel 21.8: 38 programs sorting 4096 keys; the final 27.4:
one sorting 38 * 64 keys padded to 4096), top-k 128 97.0. With 2048-logit chunks and the merge
(75 chunk programs, 5 / 10 merge programs): 21.5 / 40.3 us; 1024-logit chunks read 21.2 / 52.2 (the
final then sorts 4096 keys at top-k 128), 512 26.0 / 84.4.

Same arithmetic as the torch draw: the order keys (so top-k picks the same tokens and ties break
by ascending id), the float64 softmax and cumsum for top-p, float32 min-p against log(min_p) as
torch computes it on the device, the 31-bit hash and its uniforms, and libdevice's log and
round-to-nearest division where torch calls logf and divides. Sums are associated differently
(the softmax's, the cumsum's, the logsumexp's), so a token whose mass above it lies within a few
ulps (~1e-16) of top_p, or two Gumbel scores within a float32 ulp, may come out the other way:
the same caveat batch_sampling._filter_draw states between its two paths. The logprob agrees
to float32 rounding (tests/gpu/test_draw_gpu.py compares both with the torch draw).

Taken for one row with top_logprobs 0, no penalties, greedy or 0 < top_k <= MAX_TOP_K; the others
go through the torch draw (counted `sampling.device.torch`, this path `sampling.device.fused`)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

MAX_TOP_K = 128          # the final sort: pow2(cdiv(P, G) * KB) keys in one program (4096 at 128, V 152,064)
CH = 4096                # logits per _chunk_kernel program, greedy
SAMPLED_CH = 2048        # logits per _chunk_kernel program, sampled (each sorts its CH order keys)
MERGE_KEYS = 1024        # keys a _merge_kernel program sorts: G = MERGE_KEYS // KB chunks' top-KB each
CHUNK_WARPS = 8
MERGE_WARPS = 8
_KEY_PAD = tl.constexpr(-(2**63))     # the int64 minimum: below every order key (the padding)


@triton.jit
def _exp(x, LIB: tl.constexpr):
    # libdevice's exp / log / division on the GPU (torch's expf, logf, exp and IEEE division there);
    # Triton's own (the interpreter's numpy on the CPU) where LIB is off
    if LIB:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _log(x, LIB: tl.constexpr):
    if LIB:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _div(x, y, LIB: tl.constexpr):
    if LIB:
        return libdevice.div_rn(x, y)
    else:
        return x / y


@triton.jit
def _chunk_kernel(x, V, keys, part_m, part_s, part_i, part_f, CH: tl.constexpr, KC: tl.constexpr,
                  SAMPLED: tl.constexpr, LIB: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * CH + tl.arange(0, CH)
    inb = offs < V
    v = tl.load(x + offs, mask=inb, other=float("-inf"))
    nan = tl.max((v != v).to(tl.int32), axis=0)
    pinf = tl.max((v == float("inf")).to(tl.int32), axis=0)
    m = tl.max(v, axis=0)
    s = tl.sum(tl.where(inb & (v > float("-inf")), _exp(v - m, LIB), 0.0), axis=0)
    s = tl.where(m == float("-inf"), 0.0, s)
    tl.store(part_m + pid, m)
    tl.store(part_s + pid, s)
    tl.store(part_f + 2 * pid, nan)
    tl.store(part_f + 2 * pid + 1, pinf)
    if SAMPLED:
        # batch_sampling._order_keys: the logit's bits as a two's complement magnitude, * 2^32,
        # + V - 1 - id (distinct keys; descending = larger logit, then smaller id)
        b = v.to(tl.int32, bitcast=True).to(tl.int64)
        sg = b >> 31
        mg = (b & 0x7FFFFFFF) ^ sg
        key = (mg - sg) * 4294967296 + (V - 1 - offs.to(tl.int64))
        key = tl.where(inb, key, _KEY_PAD)
        top = tl.topk(key, KC)
        tl.store(keys + pid * KC + tl.arange(0, KC), top)
    else:
        first = tl.min(tl.where(v == m, offs, 2147483647), axis=0)
        tl.store(part_i + pid, first.to(tl.int64))


# The order keys are distinct (their low 32 bits are V - 1 - id), so the KB largest of a union of
# key sets are the KB largest of the sets' own KB largest: a key among the union's top KB has fewer
# than KB keys above it in the union, hence in its set, so it is in its set's top KB too. The
# merge therefore keeps exactly the keys (and the final kernel the order) the single sort did; the
# padding (the int64 minimum, below every key) only fills ranks past min(k, V), which the final
# kernel does not keep.
@triton.jit
def _merge_kernel(keys, N, merged, GK: tl.constexpr, KB: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * GK + tl.arange(0, GK)
    cand = tl.load(keys + offs, mask=offs < N, other=_KEY_PAD)
    tl.store(merged + pid * KB + tl.arange(0, KB), tl.topk(cand, KB))


@triton.jit
def _mix(h):
    # batch_sampling._mix: an integer hash on 31-bit values held in int64
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & 0x7FFFFFFF
    h = h ^ (h >> 12)
    h = (h * 0x297A2D39) & 0x7FFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x1B873593) & 0x7FFFFFFF
    return h ^ (h >> 16)


# ka, kb (the hash keys, random per generation and new at each position) and k are not specialized:
# Triton would compile another variant the first time one is 1 or a multiple of 16, a stall in the
# middle of a generation (the likely cause of two ~0.25 s stalls in fused greedy runs, perf-log AG6)
@triton.jit(do_not_specialize=["k", "ka", "kb"])
def _final_kernel(x, V, P, keys, NK, part_m, part_s, part_i, part_f, out, tok_out, k, ka, kb, prm64, prm32,
                  PB: tl.constexpr, NC: tl.constexpr, KB: tl.constexpr, SAMPLED: tl.constexpr,
                  LIB: tl.constexpr):
    pp = tl.arange(0, PB)
    pm = pp < P
    m = tl.load(part_m + pp, mask=pm, other=float("-inf"))
    s = tl.load(part_s + pp, mask=pm, other=0.0)
    nan = tl.max(tl.load(part_f + 2 * pp, mask=pm, other=0), axis=0)
    pinf = tl.max(tl.load(part_f + 2 * pp + 1, mask=pm, other=0), axis=0)
    M = tl.max(m, axis=0)
    S = tl.sum(tl.where(m > float("-inf"), s * _exp(m - M, LIB), 0.0), axis=0)
    lse = M + _log(S, LIB)
    if SAMPLED:
        top_p = tl.load(prm64)                                      # float64, +inf when off
        logmin = tl.load(prm32)                                     # float32 log(min_p), -inf when off
        temp = tl.load(prm32 + 1)
        cand = tl.load(keys + tl.arange(0, NC), mask=tl.arange(0, NC) < NK, other=_KEY_PAD)
        top = tl.topk(cand, KB)                                     # the row's KB largest, descending
        rank = tl.arange(0, KB)
        keep = rank < k
        ids = (V - 1) - (top & 0xFFFFFFFF)
        ids = tl.where(keep, ids, 0)
        srt = tl.load(x + ids, mask=keep, other=float("-inf"))
        srt = tl.where(keep, srt, float("-inf"))                    # top-k
        sd = srt.to(tl.float64)
        e = _exp(sd - tl.max(sd, axis=0), LIB)
        probs = e / tl.sum(e, axis=0)
        before = tl.cumsum(probs, axis=0) - probs                  # mass above each rank
        srt = tl.where(before >= top_p, float("-inf"), srt)         # top-p (the crossing kept)
        first = tl.max(tl.where(rank == 0, srt, float("-inf")), axis=0)
        srt = tl.where(srt < first + logmin, float("-inf"), srt)    # min-p
        h = _mix(_mix(ids ^ kb) ^ ka)
        u = tl.minimum((h.to(tl.float32) + 0.5) * (1.0 / 2147483648.0), 1.0 - 5.9604644775390625e-08)
        g = _div(srt, temp, LIB) - _log(-_log(u, LIB), LIB)
        gmax = tl.max(g, axis=0)
        at = tl.min(tl.where(g == gmax, rank, KB), axis=0)
        at = tl.where(at == KB, 0, at)                              # (every score NaN: rank 0, as argmax)
        tok = tl.sum(tl.where(rank == at, ids, 0), axis=0)
    else:
        i = tl.load(part_i + pp, mask=pm, other=2147483647)
        tok = tl.min(tl.where(m == M, i, 2147483647), axis=0)
        tok = tl.where(tok == 2147483647, 0, tok)
    lp = tl.load(x + tok) - lse
    tl.store(out, tok.to(tl.float64))
    tl.store(out + 1, lp.to(tl.float64))
    tl.store(out + 2, nan.to(tl.float64))
    tl.store(out + 3, pinf.to(tl.float64))
    tl.store(tok_out, tok.to(tl.int64))


def applies(params, top_logprobs: int) -> str | None:
    """None when the fused draw takes these settings, else why the torch draw does."""
    if top_logprobs > 0:
        return "top_logprobs asks for the alternatives' log-probabilities"
    if params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        return "penalties are on (the token comes from penalized logits, its logprob from the model's)"
    if params.temperature > 0 and not 0 < params.top_k <= MAX_TOP_K:
        return f"top_k {params.top_k} is not in 1..{MAX_TOP_K}"
    return None


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class FusedDraw:
    """The launches for one sampling setting on one device; scratch made once per vocabulary size.
    __call__(x (V,) float32 contiguous, a, b) -> (out (4,) float64 [token, logprob, NaN flag,
    +inf flag], token (1,) int64), both on the device, without a sync; .host is a buffer to read
    out back into.

    ch: logits a chunk program (a power of two >= KB; None: CH greedy, SAMPLED_CH sampled);
    merge_keys: keys a merge program sorts (a power of two; G = merge_keys // KB chunks a program,
    and G <= 1, e.g. 0, means no merge stage). The tests take small ones to reach the merge with
    small vocabularies; tools/draw_prof.py --variants times others and the warps."""

    def __init__(self, params, device, ch: int | None = None, merge_keys: int = MERGE_KEYS):
        self.sampled = params.temperature > 0
        self.ch = ch or (SAMPLED_CH if self.sampled else CH)
        self.device = torch.device(device)
        self.k = int(params.top_k) if self.sampled else 0
        self.kb = max(16, _pow2(self.k))
        assert self.ch == _pow2(self.ch) >= self.kb, f"chunk size {self.ch}: a power of two >= {self.kb}"
        self.g = max(1, merge_keys // self.kb)
        assert self.g == _pow2(self.g), f"merge keys {merge_keys}: a power of two (G * KB keys a tl.topk)"
        self.chunk_warps, self.merge_warps = CHUNK_WARPS, MERGE_WARPS
        # the filters' settings as batch_sampling._row_args makes them: top_p float64 (+inf: off),
        # min_p and the temperature float32; log(min_p) taken by torch on this device, as
        # _filter_draw takes it
        self.prm64 = torch.tensor([params.top_p if params.top_p < 1.0 else math.inf], dtype=torch.float64,
                                  device=self.device)
        f32 = torch.tensor([max(params.min_p, 1e-30) if params.min_p > 2**-150 else 0.0, params.temperature],
                           dtype=torch.float64).float().to(self.device)
        self.prm32 = torch.stack([torch.log(f32[0]), f32[1]])
        self.v = -1
        from minfer.ops.cuda.dequant import interpret

        self.lib = not interpret()
        self.out = torch.empty(4, dtype=torch.float64, device=self.device)
        # the caller's read-back buffer for out, kept with it (pinned where it is copied from CUDA)
        self.host = torch.empty(4, dtype=torch.float64, pin_memory=self.device.type == "cuda")
        self.tok = torch.empty(1, dtype=torch.int64, device=self.device)

    def _scratch(self, v: int) -> None:
        self.v = v
        self.p = triton.cdiv(v, self.ch)
        dev = self.device
        # merged only where it shortens the final sort: more than one chunk a group and more
        # than one group
        self.merge = self.sampled and 1 < self.g < self.p
        self.p2 = triton.cdiv(self.p, self.g) if self.merge else self.p
        self.keys = torch.empty(self.p * self.kb if self.sampled else 1, dtype=torch.int64, device=dev)
        self.cand = torch.empty(self.p2 * self.kb, dtype=torch.int64, device=dev) if self.merge else self.keys
        self.pm = torch.empty(self.p, dtype=torch.float32, device=dev)
        self.ps = torch.empty(self.p, dtype=torch.float32, device=dev)
        self.pi = torch.empty(self.p, dtype=torch.int64, device=dev)
        self.pf = torch.empty(2 * self.p, dtype=torch.int32, device=dev)

    def __call__(self, x: torch.Tensor, a: int, b: int) -> tuple:
        v = x.numel()
        if v != self.v:
            self._scratch(v)
        kb = self.kb
        _chunk_kernel[(self.p,)](x, v, self.keys, self.pm, self.ps, self.pi, self.pf, CH=self.ch, KC=kb,
                                 SAMPLED=self.sampled, LIB=self.lib, num_warps=self.chunk_warps)
        if self.merge:
            _merge_kernel[(self.p2,)](self.keys, self.p * kb, self.cand, GK=self.g * kb, KB=kb,
                                      num_warps=self.merge_warps)
        _final_kernel[(1,)](x, v, self.p, self.cand, self.p2 * kb, self.pm, self.ps, self.pi, self.pf, self.out,
                            self.tok, min(self.k, v), a, b, self.prm64, self.prm32,
                            PB=max(16, _pow2(self.p)), NC=max(16, _pow2(self.p2 * kb)), KB=kb,
                            SAMPLED=self.sampled, LIB=self.lib, num_warps=8)
        return self.out, self.tok
