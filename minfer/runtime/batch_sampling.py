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
"""

from __future__ import annotations

import math
import os
from typing import Sequence as Seq

import torch

from minfer.errors import MinferError
from minfer.runtime.sampling import check_finite, sample

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


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """(R, V) float32 in (0, 1): a pure function of (seed, position, token id) per element."""
    dev = seeds.device
    s = seeds.to(torch.int64)
    a = _mix((s & _M31) ^ _mix((s >> 31) & _M31))[:, None]                       # (R, 1)
    b = _mix(a ^ (positions.to(torch.int64)[:, None] & _M31))                  # (R, 1)
    ids = torch.arange(vocab, device=dev, dtype=torch.int64)[None, :]
    h = _mix(_mix(ids ^ b) ^ a)                                                 # (R, V)
    return (h.to(torch.float32) + 0.5) * (1.0 / 2**31)


def draw_seed(seed: int | None) -> int:
    """A sequence's draw seed: the request's (62 bits kept), or one from the OS when it gave none,
    drawn once so that the sequence's draws stay its own (across preemption in the batch engine)."""
    return int.from_bytes(os.urandom(7), "little") if seed is None else int(seed) & (2**62 - 1)


class DeviceDraw:
    """The single-sequence engine's choice of the next token on CUDA (generate.generate's
    `draw`): the batch engine's draw above for one row -- penalties, top-k, top-p, min-p,
    temperature and a counter-based Gumbel-max at (seed, position) on the device -- and only the
    token and its log-probability read back (one small copy), where the host draw copies the
    (V,) logits and filters them on the CPU (sort, softmax: ~10 ms a token at V = 152k on the
    H200's host, perf-log). The same seed therefore draws the same tokens as the CUDA batch engine."""

    def __init__(self, params, top_logprobs: int = 0):
        self.params = params
        self.seed = draw_seed(params.seed)
        self.top = top_logprobs

    def __call__(self, logits: torch.Tensor, history: Seq[int]) -> tuple[int, float, list]:
        x = logits.reshape(1, -1).float()
        tok = sample_rows(x, [self.params], [history], [self.seed], [len(history)])
        if self.top > 0:
            lps, tops = token_logprobs(x, tok, [self.top])
            t, lp, top = int(tok.item()), lps[0], tops[0]
        else:
            pair = torch.stack([tok.to(torch.float64), chosen_logprobs(x, tok).to(torch.float64)]).cpu()
            t, lp, top = int(pair[0]), float(pair[1]), []
        if not math.isfinite(lp):       # NaN/inf logits make the chosen log-probability NaN
            check_finite(x.cpu())
            raise MinferError("every token has logit -inf: no token can be sampled")
        return t, lp, top


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


def _to(values, device, dtype=None) -> torch.Tensor:
    """A host list on `device` without waiting for the device (pinned memory, non-blocking copy):
    a held batch step (batch_engine.py) samples while the GPU still runs the step before it."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def sample_rows(logits: torch.Tensor, params: Seq, histories: Seq[Seq[int]], seeds: Seq[int],
                positions: Seq[int], generators: Seq | None = None, failed: list | None = None) -> torch.Tensor:
    """logits (R, V) float32 -> token ids (R,) int64 on the logits' device, without a device
    sync. positions: the index in its sequence of the token each row draws (the draw's counter).
    generators (CPU logits only): each row's torch.Generator (None for a greedy row): the rows
    are drawn by sampling.sample, as the single engine draws (module docstring); a row whose
    draw raises MinferError (NaN logits, every token masked) gets token 0 and its error in
    failed[row] when `failed` is a list, else the error propagates."""
    if generators is not None and logits.device.type == "cpu":
        return _sample_rows_host(logits, params, histories, generators, failed)
    x = apply_penalties_rows(logits.float(), histories, params)
    R, V = x.shape
    dev = x.device
    # which rows are greedy is known on the host: no device tensor, no sync for it
    greedy = [p.temperature <= 0 for p in params]
    out = x.argmax(-1)
    if all(greedy):
        return out
    sampled = [i for i, g in enumerate(greedy) if not g]
    rows = _to(sampled, dev, torch.long)
    ps = [params[i] for i in sampled]
    xs = x.index_select(0, rows)                                                # (r, V)
    srt, order = xs.sort(-1, descending=True)
    rank = torch.arange(V, device=dev)[None, :]
    k = _to([p.top_k if 0 < p.top_k < V else V for p in ps], dev)[:, None]
    srt = srt.masked_fill(rank >= k, -math.inf)                                 # top-k
    probs = torch.softmax(srt.double(), -1)
    before = torch.cumsum(probs, -1) - probs                                    # mass above each rank
    top_p = _to([p.top_p for p in ps], dev, torch.float64)[:, None]
    srt = srt.masked_fill((before >= top_p) & (top_p < 1.0), -math.inf)        # top-p (crossing kept)
    min_p = _to([max(p.min_p, 0.0) for p in ps], dev)[:, None]
    floor = torch.where(min_p > 0, srt[:, :1] + torch.log(min_p.clamp_min(1e-30)), torch.full_like(min_p, -math.inf))
    srt = srt.masked_fill(srt < floor, -math.inf)                               # min-p
    temp = _to([p.temperature for p in ps], dev)[:, None]
    sel_seeds = _to([seeds[i] for i in sampled], dev)
    sel_pos = _to([positions[i] for i in sampled], dev)
    u = uniforms(sel_seeds, sel_pos, V).gather(1, order)                        # noise of each sorted token
    g = srt / temp - torch.log(-torch.log(u))
    pick = order.gather(1, g.argmax(-1, keepdim=True)).squeeze(1)
    return out.index_copy(0, rows, pick)


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
