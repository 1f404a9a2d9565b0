"""Choosing the next token of many sequences at once, on the logits' device.

Same chain and semantics as minfer/runtime/sampling.py (llama.cpp's order: penalties -> top-k
-> top-p -> min-p -> temperature -> draw). On CUDA it is vectorized over rows with per-row
parameters, so a batch of 128 sequences does not copy (128, vocab) logits to the host or loop
over them.

Two draws, by device:
- CPU (the engine passes each sequence's torch.Generator): each row goes through
  sampling.sample, the single-user engine's own function, with a generator seeded as
  generate.generate seeds its one (sampling.make_generator(seed)) and advanced once per drawn
  token. A seeded request therefore gives the single engine's tokens exactly, alone or batched,
  through preemption (a recomputed prefix draws nothing) and held steps (each token is drawn
  once, in order). Nothing waits for a device on the CPU, so the loop over rows costs only the
  single engine's own per-token work.
- CUDA: a Gumbel-max over the kept tokens (argmax of logit/T - log(-log u), which samples
  exactly softmax(logit/T)), with u from a counter-based hash of (the sequence's seed, the
  position of the token being drawn, the token id), computed on the device without a host
  sync. A sequence's draws depend only on its own seed and tokens: never on which other
  sequences share the batch, nor on preemption. They are not the single engine's draws, so a
  seeded request gives another (equally distributed) answer there. Why not the same: the single
  engine draws on the host from a CPU torch.Generator (mt19937): torch.multinomial with one
  sample is argmax(p / q) with q ~ Exp(1) of V float64 values from the generator. Reproducing
  it means making those V values on the host for every sampled row of every step -- measured
  2.4 ms per row for V = 151,936 on the 2-core CPU machine, ~300 ms a step at 128 rows against
  a GPU step of a few ms -- and copying them over; and the batched kernels' logits differ from
  the single engine's in the last bits anyway (issue 13: greedy equality holds "within the
  numerics of the batched kernels"), which can move a top-p/min-p boundary or a near tie.
- Candidates (CUDA draw): a row with 0 < top_k <= TOP_K_CAP runs the chain on its top_k largest
  logits only, taken by torch.topk, where the others sort the whole vocabulary and hash every
  token id; the tokens beyond top_k are -inf in the sorted chain, so the same tokens are drawn
  (_filter_draw says why, tests/runtime/test_batch_sampling_topk.py checks it against the
  sorted code). CPU, one thread, V = 152,064, default parameters: 18.6 -> 1.3 ms a call for one
  row, 945 -> 123 ms for 32 rows, against the sorted code.
"""

from __future__ import annotations

import math
import os
from typing import Sequence as Seq

import torch

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.runtime.sampling import sample

_M31 = 0x7FFFFFFF


def _mix(h: torch.Tensor) -> torch.Tensor:
    """An integer hash on 31-bit values held in int64 (products stay below 2^62: no overflow)."""
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & _M31
    h = h ^ (h >> 12)
    h = (h * 0x297A2D39) & _M31
    h = h ^ (h >> 15)
    h = (h * 0x1B873593) & _M31
    return h ^ (h >> 16)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, ids: int | torch.Tensor) -> torch.Tensor:
    """Float32 in (0, 1), a pure function of (seed, position, token id) per element: (R, V) for
    every id of a vocabulary of `ids` tokens, or (R, n) for an int64 tensor `ids` (R, n) of token
    ids (the same value as the (R, V) form's at each id: the hash is elementwise)."""
    dev = seeds.device
    s = seeds.to(torch.int64)
    a = _mix((s & _M31) ^ _mix((s >> 31) & _M31))[:, None]                       # (R, 1)
    b = _mix(a ^ (positions.to(torch.int64)[:, None] & _M31))                  # (R, 1)
    if not torch.is_tensor(ids):
        ids = torch.arange(ids, device=dev, dtype=torch.int64)[None, :]
    return _unit(_mix(_mix(ids ^ b) ^ a))                                       # (R, V) or (R, n)


# The largest float32 below 1. h of 31 bits becomes a float32 of 24 significant bits, so the 64
# largest h round to 2^31 and (h + 0.5) / 2^31 to exactly 1.0: then -log(-log u) is +inf, and a
# token masked to -inf got -inf + inf = NaN, which argmax takes as the maximum -- ~0.45% of draws at
# V = 152k picked a filtered token (64 / 2^31 per token id). Clamped, u stays in (0, 1).
_U_MAX = 1.0 - 2.0**-24


def _unit(h: torch.Tensor) -> torch.Tensor:
    """31-bit hashes -> float32 uniforms in (0, 1)."""
    return ((h.to(torch.float32) + 0.5) * (1.0 / 2**31)).clamp_max_(_U_MAX)


def draw_seed(seed: int | None) -> int:
    """A sequence's draw seed: the request's (62 bits kept), or one from the OS when it gave none,
    drawn once so that the sequence's draws stay its own (across preemption in the batch engine)."""
    return int.from_bytes(os.urandom(7), "little") if seed is None else int(seed) & (2**62 - 1)


def apply_penalties_rows(logits: torch.Tensor, histories: Seq[Seq[int]], params: Seq) -> torch.Tensor:
    """llama.cpp's repeat/presence/frequency penalties (sampling.apply_penalties) per row."""
    out = logits
    for r, (hist, p) in enumerate(zip(histories, params)):
        if p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
            continue
        n = p.penalty_last_n
        recent = list(hist) if n < 0 else list(hist)[-n:] if n > 0 else []
        if not recent:
            continue
        if out is logits:
            out = logits.clone()
        ids, counts = torch.tensor(recent, dtype=torch.long).unique(return_counts=True)
        ids, c = ids.to(out.device), counts.to(out.device, out.dtype)
        x = out[r, ids]
        x = torch.where(x <= 0, x * p.repeat_penalty, x / p.repeat_penalty)
        out[r, ids] = x - c * p.frequency_penalty - p.presence_penalty
    return out


# Rows whose top_k is at most this many are filtered and drawn on their top_k_max largest logits
# alone (torch.topk), where the others sort the whole vocabulary: the tokens beyond a row's top_k
# are masked anyway, so the draw is the same (sample_rows). 1024 is far above the top_k that
# requests use (llama.cpp's default 40; 20..100 in model cards) while the candidates' work --
# softmax, cumsum, masks, the hash -- stays under 1% of V = 152k, and torch.topk's sort of its
# k results stays in its one-block in-place sort (pytorch sortKeyValueInplace: slices of <= 4096).
TOP_K_CAP = 1024

_IOTA: dict = {}


def _iota(n: int, device, descending: bool = False) -> torch.Tensor:
    """arange(n) int64 on `device` (n-1 .. 0 when descending), made once per (n, device)."""
    key = (n, str(device), descending)
    t = _IOTA.get(key)
    if t is None:
        t = torch.arange(n, device=device, dtype=torch.int64)
        _IOTA[key] = t = (n - 1) - t if descending else t
    return t


def _row_keys(seed: int, position: int) -> tuple[int, int]:
    """uniforms' per-row keys (a, b) of one (seed, position), on the host: the same 31-bit
    arithmetic as the device's (Python integers are exact, the device's int64 never overflows),
    so the draw sends two numbers a row instead of ~45 tiny kernels making them."""
    def mix(h: int) -> int:
        h ^= h >> 15
        h = (h * 0x2C1B3C6D) & _M31
        h ^= h >> 12
        h = (h * 0x297A2D39) & _M31
        h ^= h >> 15
        h = (h * 0x1B873593) & _M31
        return h ^ (h >> 16)
    s = int(seed)
    a = mix((s & _M31) ^ mix((s >> 31) & _M31))
    return a, mix(a ^ (int(position) & _M31))


def _order_keys(x: torch.Tensor) -> torch.Tensor:
    """(R, V) float32 -> int64 keys, all distinct, whose descending order is the order of a stable
    descending sort of x: larger logit first, equal logits by ascending token id (torch.sort's
    order on CUDA, whose sort of a row over 4096 values is always the stable cub radix sort:
    pytorch aten/src/ATen/native/cuda/Sort.cpp). torch.topk of these keys therefore picks and
    orders the same tokens on every device, where topk of the logits leaves equal logits at its
    k-th value to the kernel (the CPU's nth_element, the CUDA kernel's warp reservations).
    Key: the logit's IEEE-754 bits as sign and magnitude turned into a two's complement integer
    (+m or -m, so -0.0 and +0.0 are equal as the sort compares them), times 2^32, plus V-1-id.
    NaN: +NaN sorts above +inf (as in torch.sort) and -NaN below -inf; a row with a NaN has no
    meaningful draw on either path (DeviceDraw refuses it after the draw)."""
    b = x.view(torch.int32).to(torch.int64)          # sign-extended bits
    s = b >> 31                                      # -1 where the sign bit is set, else 0
    m = (b & _M31) ^ s                               # magnitude, bitwise-negated for negatives
    return (m - s) * 2**32 + _iota(x.shape[1], x.device, descending=True)


def _row_args(ps: Seq, keys: Seq[tuple[int, int]], ks: Seq[int], rows: Seq[int], device):
    """The draw's per-row arguments on `device` from one host tensor (one pinned non-blocking copy
    on CUDA: a held batch step, batch_engine.py, samples while the GPU still runs the step before
    it): top_k (r, 1) int64, the hash keys a, b (r,), the row indices (or None), top_p (r, 1)
    float64 (+inf where off: `before >= top_p` is then never true), and float32 (r, 1) min_p (0
    where off: its log, -inf, keeps every token) and temperature."""
    r = len(ps)
    ints = torch.tensor(list(ks) + [a for a, _ in keys] + [b for _, b in keys] + list(rows), dtype=torch.int64)
    fl = torch.tensor([p.top_p if p.top_p < 1.0 else math.inf for p in ps]
                      + [max(p.min_p, 1e-30) if p.min_p > 2**-150 else 0.0 for p in ps]   # > 0 in float32
                      + [p.temperature for p in ps], dtype=torch.float64)
    host = torch.cat([ints, fl.view(torch.int64)])
    if torch.device(device).type == "cuda":
        d = host.pin_memory().to(device, non_blocking=True)
    else:
        d = host.to(device)
    n = 3 * r + len(rows)
    f = d[n:].view(torch.float64)
    f32 = f[r:].float()
    return (d[:r, None], d[r:2 * r], d[2 * r:3 * r], d[3 * r:n] if rows else None,
            f[:r, None], f32[:r, None], f32[r:, None])


def _uniforms_at(a: torch.Tensor, b: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """uniforms() of rows whose keys a, b (R,) are given, at the token ids (R, n)."""
    return _unit(_mix(_mix(ids ^ b[:, None]) ^ a[:, None]))


def _filter_draw(srt, order, k, a, b, top_p, min_p, temp) -> torch.Tensor:
    """top-k, top-p, min-p, temperature and the Gumbel-max draw on rows of logits in descending
    order (srt (r, n), their token ids `order`, ties by ascending id) -> the drawn ids (r,).
    n is V (the whole vocabulary sorted) or at least every row's k (its candidates, in the same
    order: _order_keys). Why both draw the same token: ranks >= k are masked first, so the kept
    set is the same; min-p compares logits with the top one; the noise is per token id; argmax
    takes the first of equal scores, at the same rank; a masked token scores -inf, never NaN
    (u < 1: _U_MAX), so the ranks beyond the candidates can never win. Top-p sums the same float64
    probabilities -- exp(logit - max) / sum, the masked ones adding exact zeros -- equal bit for
    bit on the CPU (tested); on CUDA softmax and cumsum over n = kmax instead of V may associate
    their sums otherwise, so only a token whose mass above lies within a few ulps (~1e-16) of
    top_p could fall on the other side of it."""
    rank = _iota(srt.shape[1], srt.device)[None, :]
    srt = srt.masked_fill(rank >= k, -math.inf)                                 # top-k
    probs = torch.softmax(srt.double(), -1)
    before = torch.cumsum(probs, -1) - probs                                    # mass above each rank
    srt = srt.masked_fill(before >= top_p, -math.inf)                           # top-p (crossing kept)
    srt = srt.masked_fill(srt < srt[:, :1] + torch.log(min_p), -math.inf)       # min-p
    g = srt / temp - torch.log(-torch.log(_uniforms_at(a, b, order)))
    return order.gather(1, g.argmax(-1, keepdim=True)).squeeze(1)


def sample_rows(logits: torch.Tensor, params: Seq, histories: Seq[Seq[int]], seeds: Seq[int],
                positions: Seq[int], generators: Seq | None = None, failed: list | None = None) -> torch.Tensor:
    """logits (R, V) float32 -> token ids (R,) int64 on the logits' device, without a device
    sync. positions: the index in its sequence of the token each row draws (the draw's counter).
    generators (CPU logits only): each row's torch.Generator (None for a greedy row): the rows
    are drawn by sampling.sample, as the single engine draws (module docstring); a row whose
    draw raises MinferError (NaN logits, every token masked) gets token 0 and its error in
    failed[row] when `failed` is a list, else the error propagates.
    Rows with 0 < top_k <= TOP_K_CAP are drawn from their top_k_max largest logits (torch.topk of
    _order_keys), the others from the whole vocabulary sorted; the tokens are the same."""
    if generators is not None and logits.device.type == "cpu":
        return _sample_rows_host(logits, params, histories, generators, failed)
    return _sample_rows(logits, params, histories, seeds, positions, TOP_K_CAP)


def _sample_rows(logits, params, histories, seeds, positions, cap: int) -> torch.Tensor:
    """sample_rows' device draw; cap: the largest top_k drawn from candidates (0: none, every
    sampled row sorts the whole vocabulary -- the reference the tests compare with)."""
    x = apply_penalties_rows(logits.float(), histories, params)
    R, V = x.shape
    # which rows are greedy, and which path each sampled row takes, is known on the host
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    few = [i for i in sampled if 0 < params[i].top_k <= cap]
    whole = [i for i in sampled if not 0 < params[i].top_k <= cap]
    if few:
        paths.count("sampling.rows.top_k_candidates")
    if whole:
        # top_k off or above the cap is what the request asked for, not a fallback: its own path
        paths.count("sampling.rows.sorted")
    out = None if sampled and R in (len(few), len(whole)) else x.argmax(-1)  # argmax only for greedy rows
    for group, on_candidates in ((few, True), (whole, False)):
        if not group:
            continue
        ps = [params[i] for i in group]
        keys = [_row_keys(seeds[i], positions[i]) for i in group]
        every = len(group) == R                       # no greedy row, one path: no row gather
        if on_candidates:
            ks = [min(p.top_k, V) for p in ps]
        else:
            ks = [p.top_k if 0 < p.top_k < V else V for p in ps]
        k, a, b, rows, top_p, min_p, temp = _row_args(ps, keys, ks, [] if every else group, x.device)
        xs = x if every else x.index_select(0, rows)                           # (r, V)
        if on_candidates:
            order = torch.topk(_order_keys(xs), max(ks), -1).indices            # (r, kmax)
            srt = xs.gather(1, order)
        else:
            srt, order = xs.sort(dim=-1, descending=True, stable=True)
        pick = _filter_draw(srt, order, k, a, b, top_p, min_p, temp)
        out = pick if every else out.index_copy(0, rows, pick)
    return out


def _sample_rows_host(logits: torch.Tensor, params: Seq, histories: Seq[Seq[int]], generators: Seq,
                      failed: list | None) -> torch.Tensor:
    """The CPU draw: sampling.sample per row, exactly the single engine's (its float32 logits,
    penalties over the same history, filters, float64 softmax and generator)."""
    toks = []
    for r, (p, hist, gen) in enumerate(zip(params, histories, generators)):
        try:
            toks.append(sample(logits[r], p, gen, hist))
        except MinferError as e:
            if failed is None:
                raise
            failed[r] = e
            toks.append(0)
    return torch.tensor(toks, dtype=torch.long)


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The model's log-probabilities of the chosen tokens (R,), on the logits' device (no sync)."""
    x = logits.float()
    return x.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(x, -1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top_n: Seq[int]):
    """The model's log-probabilities (before any filter) of the chosen tokens, (R,) on the host,
    and for rows with top_n > 0 their top_n alternatives [(id, logprob)] (else [])."""
    n_max = max(top_n, default=0)
    tops = [[] for _ in top_n]
    if n_max <= 0:
        # the chosen tokens' log-probabilities only: one reduction, no (R, V) log-softmax written
        return chosen_logprobs(logits, tokens).tolist(), tops
    lp_all = torch.log_softmax(logits.float(), -1)
    lp = lp_all.gather(1, tokens[:, None]).squeeze(1).tolist()
    if n_max > 0:
        v, i = torch.topk(lp_all, min(n_max, lp_all.shape[-1]), -1)
        v, i = v.tolist(), i.tolist()
        for r, n in enumerate(top_n):
            tops[r] = list(zip(i[r][:n], v[r][:n]))
    return lp, tops
