"""The batched device draw on top-k candidates (batch_sampling.sample_rows): rows with a small
top_k are filtered and drawn on their top_k_max largest logits only, and must draw exactly the
tokens of the whole-vocabulary sort that came before it.

The reference here is that earlier code, kept verbatim apart from `stable=True`: on CUDA, where
the draw runs, torch.sort of a row over 4096 values is always the stable radix sort (pytorch
aten/src/ATen/native/cuda/Sort.cpp), so equal logits were ordered by ascending token id there; the
CPU's default sort orders them otherwise, and the stable sort pins the reference to CUDA's order.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from minfer.ops import paths
from minfer.runtime import batch_sampling as bs
from minfer.runtime.batch_sampling import (
    _order_keys,
    _row_keys,
    _sample_rows,
    _uniforms_at,
    sample_rows,
    uniforms,
)
from minfer.runtime.sampling import SamplingParams

# on a GPU machine the same checks run on CUDA too, where the draw runs (torch's CUDA topk, sort,
# softmax and cumsum)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _reference(logits, params, histories, seeds, positions):
    """sample_rows as it was before the candidate path (commit e94b080), the sort made stable."""
    x = bs.apply_penalties_rows(logits.float(), histories, params)
    _, V = x.shape
    greedy = [p.temperature <= 0 for p in params]
    out = x.argmax(-1)
    if all(greedy):
        return out
    sampled = [i for i, g in enumerate(greedy) if not g]
    dev = x.device
    rows = torch.tensor(sampled, dtype=torch.long, device=dev)
    ps = [params[i] for i in sampled]
    xs = x.index_select(0, rows)
    srt, order = xs.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(V, device=dev)[None, :]
    k = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in ps], device=dev)[:, None]
    srt = srt.masked_fill(rank >= k, -math.inf)
    probs = torch.softmax(srt.double(), -1)
    before = torch.cumsum(probs, -1) - probs
    top_p = torch.tensor([p.top_p for p in ps], dtype=torch.float64, device=dev)[:, None]
    srt = srt.masked_fill((before >= top_p) & (top_p < 1.0), -math.inf)
    min_p = torch.tensor([max(p.min_p, 0.0) for p in ps], device=dev)[:, None]
    floor = torch.where(min_p > 0, srt[:, :1] + torch.log(min_p.clamp_min(1e-30)), torch.full_like(min_p, -math.inf))
    srt = srt.masked_fill(srt < floor, -math.inf)
    temp = torch.tensor([p.temperature for p in ps], device=dev)[:, None]
    sel_seeds = torch.tensor([seeds[i] for i in sampled], device=dev)
    sel_pos = torch.tensor([positions[i] for i in sampled], device=dev)
    u = uniforms(sel_seeds, sel_pos, V).gather(1, order)
    assert float(u.max()) < 1        # the one change in this reference: u == 1.0 drew masked tokens
    g = srt / temp - torch.log(-torch.log(u))
    pick = order.gather(1, g.argmax(-1, keepdim=True)).squeeze(1)
    return out.index_copy(0, rows, pick)


def _logits(rng: random.Random, gen: torch.Generator, R: int, V: int) -> torch.Tensor:
    """Rows of every kind: spread, coarse (many ties), one value repeated, -inf masks of every
    density (down to a whole row), signed zeros, and +inf."""
    rows = []
    for _ in range(R):
        kind = rng.choice(["spread", "coarse", "coarse", "flat", "masked", "zeros"])
        if kind == "spread":
            row = torch.randn(V, generator=gen) * rng.choice([0.5, 3.0, 10.0])
        elif kind == "coarse":
            row = torch.randint(-4, 4, (V,), generator=gen).float() * rng.choice([0.25, 1.0])
        elif kind == "flat":
            row = torch.full((V,), rng.choice([-2.0, 0.0, 1.5]))
            row[torch.randint(0, V, (rng.randint(0, 3),), generator=gen)] += 1.0
        elif kind == "zeros":
            row = torch.where(torch.rand(V, generator=gen) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
            row[torch.randint(0, V, (rng.randint(0, 5),), generator=gen)] = rng.choice([-1.0, 1.0, -0.0])
        else:
            row = torch.randint(-3, 3, (V,), generator=gen).float()
            keep = rng.choice([0.0, 1.0 / V, 0.01, 0.2, 0.9])
            row[torch.rand(V, generator=gen) >= keep] = -math.inf
        if rng.random() < 0.05:
            row[rng.randrange(V)] = math.inf
        rows.append(row)
    return torch.stack(rows)


def _params(rng: random.Random, V: int) -> SamplingParams:
    if rng.random() < 0.15:
        return SamplingParams(temperature=0)
    return SamplingParams(
        temperature=rng.choice([0.1, 0.7, 0.8, 1.0, 1.5, 5.0]),
        top_k=rng.choice([-1, 0, 1, 2, 3, 5, 40, V - 1, V, V + 3, 1024, 1025]),
        top_p=rng.choice([1.0, 0.95, 0.9, 0.5, 0.3, 0.0]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.3, 1.0, 1e-46]),
        repeat_penalty=rng.choice([1.0, 1.0, 1.3]),
        presence_penalty=rng.choice([0.0, 0.0, 0.5]),
        frequency_penalty=rng.choice([0.0, 0.2]),
        penalty_last_n=rng.choice([64, -1, 0]),
    )


def test_row_keys_and_uniforms_at_ids_are_uniforms_values():
    g = torch.Generator().manual_seed(0)
    seeds = [0, 1, 2**40 + 5, 2**62 - 1, 12345678901234]
    pos = [0, 7, 3, 2**31 + 9, 100000]
    V = 3000
    full = uniforms(torch.tensor(seeds), torch.tensor(pos), V)                 # (R, V)
    ids = torch.randint(0, V, (len(seeds), 300), generator=g)
    assert torch.equal(uniforms(torch.tensor(seeds), torch.tensor(pos), ids), full.gather(1, ids))
    keys = [_row_keys(s, p) for s, p in zip(seeds, pos)]
    a, b = torch.tensor([k[0] for k in keys]), torch.tensor([k[1] for k in keys])
    assert torch.equal(_uniforms_at(a, b, ids), full.gather(1, ids))
    assert torch.equal(_uniforms_at(a, b, torch.arange(V).expand(len(seeds), V)), full)


@pytest.mark.parametrize("device", DEVICES)
def test_order_keys_give_the_stable_descending_sort(device):
    rng, g = random.Random(1), torch.Generator().manual_seed(1)
    for _ in range(20):
        x = _logits(rng, g, 6, rng.choice([5, 300, 5000])).to(device)
        keys = _order_keys(x)
        up = keys.sort(dim=-1).values
        assert bool((up[:, 1:] > up[:, :-1]).all())                   # all distinct
        got = torch.topk(keys, x.shape[1], -1).indices
        assert torch.equal(got, x.sort(dim=-1, descending=True, stable=True).indices)
        k = rng.randint(1, x.shape[1])
        assert torch.equal(torch.topk(keys, k, -1).indices, got[:, :k])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [7, 64, 1500, 3000])
def test_candidate_draws_are_the_whole_vocabulary_draws(V, device):
    """Random logits (ties at every boundary, -inf, signed zeros), random per-row parameters
    (greedy rows, penalties, top_k off, over V and over the cap among them), seeds, positions:
    the candidate path, the whole-vocabulary path (cap 0) and the earlier code agree on every
    token; cap 4 mixes both paths in one call."""
    rng, g = random.Random(V), torch.Generator().manual_seed(V)
    n_rows = n_cand = 0
    for trial in range(60 if V < 3000 else 12):
        R = rng.choice([1, 2, 5, 16])
        x = _logits(rng, g, R, V).to(device)
        params = [_params(rng, V) for _ in range(R)]
        hist = [[rng.randrange(V) for _ in range(rng.randint(0, 20))] for _ in range(R)]
        seeds = [rng.getrandbits(62) for _ in range(R)]
        pos = [rng.randrange(0, 2**33) for _ in range(R)]
        want = _reference(x, params, hist, seeds, pos)
        got = sample_rows(x, params, hist, seeds, pos)
        assert torch.equal(got, want), (trial, params, got, want)
        assert torch.equal(_sample_rows(x, params, hist, seeds, pos, 0), want)
        assert torch.equal(_sample_rows(x, params, hist, seeds, pos, 4), want)
        n_rows += R
        n_cand += sum(p.temperature > 0 and 0 < p.top_k <= bs.TOP_K_CAP for p in params)
    assert n_cand > n_rows // 3          # the candidate path did most of the drawing


@pytest.mark.parametrize("device", DEVICES)
def test_ties_across_the_top_k_boundary_at_full_vocabulary(device):
    """V = 152,064 (Qwen): a run of equal logits straddling rank top_k (and the candidates' end),
    so which of them are kept decides the draw; 24 seeds, so tied tokens get drawn."""
    g = torch.Generator().manual_seed(7)
    V, R = 152064, 24
    row = torch.randn(V, generator=g) * 2
    top = row.topk(60).values
    tie = torch.randint(0, V, (400,), generator=g)
    row[tie[row[tie] < top[-1]]] = float(top[30])      # ~400 copies of the 31st value
    x = row.expand(R, V).contiguous().to(device)
    p = [SamplingParams(temperature=50.0, top_k=40, top_p=1.0, min_p=0.0)] * (R // 2) + \
        [SamplingParams(temperature=50.0, top_k=rng_k, top_p=0.999, min_p=0.0) for rng_k in range(32, 32 + R - R // 2)]
    seeds, pos = list(range(R)), [5] * R
    want = _reference(x, p, [[]] * R, seeds, pos)
    assert torch.equal(sample_rows(x, p, [[]] * R, seeds, pos), want)
    tied = set(torch.nonzero(row == top[30]).flatten().tolist())
    assert len(set(want.tolist()) & tied) >= 2       # the tied run is drawn from, not avoided


def test_no_host_sync_on_the_draw():
    """On the meta device every value is unknown: any .item()/.tolist()/bool() of a device tensor
    would raise, so the draw reading nothing back from the device passes."""
    x = torch.empty(4, 1000, device="meta")
    params = [SamplingParams(), SamplingParams(temperature=0), SamplingParams(top_k=0),
              SamplingParams(top_k=7, top_p=0.5, min_p=0.1, repeat_penalty=1.2)]
    out = sample_rows(x, params, [[], [1], [2, 3], [4, 4]], [1, 2, 3, 4], [0, 1, 2, 3])
    assert out.device.type == "meta" and out.shape == (4,) and out.dtype == torch.int64
    out = sample_rows(x[:1], params[:1], [[]], [1], [0])
    assert out.device.type == "meta" and out.shape == (1,)


def test_paths_count_the_candidates_and_the_sorted_rows_apart():
    paths.reset()
    x = torch.randn(3, 100)
    sample_rows(x, [SamplingParams(), SamplingParams(top_k=0), SamplingParams(top_k=bs.TOP_K_CAP + 1)],
                [[], [], []], [1, 2, 3], [0, 0, 0])
    snap = paths.snapshot()
    assert snap["counts"] == {"sampling.rows.top_k_candidates": 1, "sampling.rows.sorted": 1}
    assert not snap["fallbacks"]            # a top_k off or above the cap is asked for, not a fallback
    paths.reset()


@pytest.mark.parametrize("seed, hit", [(151911, 51), (386872, 57), (1510344, 36)])
def test_a_token_whose_noise_rounds_to_one_is_not_drawn_when_filtered(seed, hit):
    """(seed, position 0, token `hit`) hashes to one of the 64 largest 31-bit values, whose
    (h + 0.5) / 2^31 is 1.0 in float32: unclamped, the filtered token's Gumbel score was
    -inf + inf = NaN and argmax drew it (the earlier code drew `hit` here on both paths)."""
    h = bs._mix(bs._mix(torch.tensor([[hit]]) ^ _row_keys(seed, 0)[1]) ^ _row_keys(seed, 0)[0])
    assert float((h.to(torch.float32) + 0.5) * (1.0 / 2**31)) == 1.0
    x = torch.zeros(1, 64)
    x[0, 3], x[0, hit] = 5.0, -3.0
    for p in (SamplingParams(top_k=1), SamplingParams(top_k=0, top_p=0.5), SamplingParams(top_k=0, min_p=0.5)):
        assert int(sample_rows(x, [p], [[]], [seed], [0])) == 3
        assert int(_sample_rows(x, [p], [[]], [seed], [0], 0)) == 3
    u = uniforms(torch.tensor([seed]), torch.tensor([0]), 64)
    assert 0 < float(u.min()) and float(u.max()) < 1 and float(u[0, hit]) == 1 - 2**-24
