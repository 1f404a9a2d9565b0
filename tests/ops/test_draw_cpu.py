"""ops/cuda/draw.py's kernels in Triton's interpreter against the torch draw they replace
(batch_sampling.sample_rows and chosen_logprobs, on the CPU): the same token, the same logprob to
float32 rounding, the NaN / +inf flags, with and without the merge stage (small chunks and merge
groups reach it at small vocabularies); when the merge is launched; and which requests the fused
draw takes."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.batch_sampling import _order_keys, _row_keys, chosen_logprobs, draw_seed, sample_rows
from minfer.runtime.sampling import SamplingParams


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _fused(p, x, seed, pos, ch=256, **kw):
    from minfer.ops.cuda import draw

    out, tok = draw.FusedDraw(p, "cpu", ch=ch, **kw)(x, *_row_keys(seed, pos))
    return out, tok


def _torch(p, x, seed, pos):
    ref = sample_rows(x[None], [p], [[]], [seed], [pos])
    return int(ref[0]), float(chosen_logprobs(x[None], ref)[0])


CASES = [
    SamplingParams(temperature=0),
    SamplingParams(seed=5),                                                   # the defaults: top-k 40
    SamplingParams(seed=6, top_k=100, top_p=0.5, min_p=0.0, temperature=1.3),
    SamplingParams(seed=7, top_k=1),
    SamplingParams(seed=8, top_k=128, top_p=1.0, min_p=0.3, temperature=0.2),
]
IDS = ["greedy", "default", "top_p", "top_k1", "min_p"]


@pytest.mark.parametrize("p", CASES, ids=IDS)
def test_the_same_draw_as_the_torch_path(p):
    g = torch.Generator().manual_seed(1)
    for trial, v in enumerate((1000, 777)):
        x = torch.randn(v, generator=g) * 3
        if trial == 1:
            x[::5] = x[3]               # ties everywhere: the order keys break them by id
        seed, pos = draw_seed(p.seed if p.seed is not None else 0), 40 + trial
        out, tok = _fused(p, x, seed, pos)
        t, lp = _torch(p, x, seed, pos)
        assert int(out[0]) == t == int(tok[0])
        assert abs(float(out[1]) - lp) < 1e-5
        assert out[2:].tolist() == [0.0, 0.0]


SAMPLED = [(p, i) for p, i in zip(CASES, IDS) if p.temperature > 0]


@pytest.mark.parametrize("p", [p for p, _ in SAMPLED], ids=[i for _, i in SAMPLED])
def test_the_merge_stage_draws_the_same_as_the_torch_path(p):
    """Chunks of KB logits, merged two a program: 5 chunks (the last one short) in 3 merge
    programs (the last one a single chunk). The merged candidates hold the row's top KB order
    keys, and the draw is the torch draw's, with ties within and across chunks and merge groups.
    (The interpreter's tl.topk costs ~0.1 s a program: the smallest sizes that reach the merge.)"""
    from minfer.ops.cuda import draw

    g = torch.Generator().manual_seed(11)
    kb = max(16, draw._pow2(p.top_k))
    v = 5 * kb - 7
    for trial in range(2):
        x = torch.randn(v, generator=g) * 3
        if trial == 0:
            x[::5] = x[3]               # ties everywhere
        else:                           # ~1.25 k tied maxima: top-k all ties, across the groups
            x[::max(1, v // (p.top_k + p.top_k // 4 + 1))] = x.max()
        seed, pos = draw_seed(p.seed), 60 + trial
        fd = draw.FusedDraw(p, "cpu", ch=kb, merge_keys=2 * kb)
        out, tok = fd(x, *_row_keys(seed, pos))
        assert fd.merge and (fd.p, fd.p2) == (5, 3)
        want = torch.topk(_order_keys(x[None])[0], kb).values
        assert torch.equal(torch.topk(fd.cand, kb).values, want)
        t, lp = _torch(p, x, seed, pos)
        assert int(out[0]) == t == int(tok[0])
        assert abs(float(out[1]) - lp) < 1e-5
        assert out[2:].tolist() == [0.0, 0.0]


class _Launches:
    """A kernel stand-in that logs (name, programs) instead of launching."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *args, **kw: self.log.append((self.name, grid[0]))


# (params, V, ch, merge_keys) -> the chunk programs and the merge programs (0: not launched)
LAUNCHES = [
    (SamplingParams(seed=1), 3000, 128, 256, 24, 6),              # KB 64, G 4
    (SamplingParams(seed=1), 513, 128, 256, 5, 2),                # one chunk more than a group
    (SamplingParams(seed=1), 512, 128, 256, 4, 0),                # one group: the final reads the chunks
    (SamplingParams(seed=1), 3000, 128, 0, 24, 0),                # merge off
    (SamplingParams(seed=1, top_k=128), 3000, 128, 128, 24, 0),   # G 1: nothing to merge
    (SamplingParams(seed=1, top_k=128), 3000, 128, 512, 24, 6),   # KB 128, G 4
    (SamplingParams(seed=1, top_k=1), 3000, 128, 256, 24, 2),     # KB 16, G 16
    (SamplingParams(temperature=0), 3000, 128, 256, 24, 0),       # greedy: no keys to merge
    (SamplingParams(seed=1), 152064, None, 1024, 75, 5),          # the defaults at the 7B's vocabulary
    (SamplingParams(seed=1, top_k=128), 152064, None, 1024, 75, 10),
    (SamplingParams(seed=1, top_k=1), 152064, None, 1024, 75, 2),
    (SamplingParams(seed=1), 4097, None, 1024, 3, 0),
    (SamplingParams(temperature=0), 152064, None, 1024, 38, 0),   # greedy keeps 4096-logit chunks
]


@pytest.mark.parametrize("p,v,ch,mk,chunks,merges", LAUNCHES)
def test_the_merge_is_launched_exactly_when_it_shortens_the_sort(monkeypatch, p, v, ch, mk, chunks, merges):
    from minfer.ops.cuda import draw

    log = []
    for name in ("_chunk_kernel", "_merge_kernel", "_final_kernel"):
        monkeypatch.setattr(draw, name, _Launches(name, log))
    fd = draw.FusedDraw(p, "cpu", ch=ch, merge_keys=mk)
    fd(torch.zeros(v), 1, 2)
    merge = [("_merge_kernel", merges)] if merges else []
    assert log == [("_chunk_kernel", chunks)] + merge + [("_final_kernel", 1)]


def test_a_vocabulary_smaller_than_top_k():
    p = SamplingParams(seed=3, top_k=40, top_p=1.0, min_p=0.0)
    x = torch.randn(30, generator=torch.Generator().manual_seed(2))
    out, _ = _fused(p, x, draw_seed(3), 9)
    assert int(out[0]) == _torch(p, x, draw_seed(3), 9)[0]


@pytest.mark.parametrize("bad,flag", [(math.nan, 2), (math.inf, 3)])
def test_non_finite_logits_raise_their_flag(bad, flag):
    x = torch.randn(600, generator=torch.Generator().manual_seed(4))
    x[517] = bad
    for p in (SamplingParams(temperature=0), SamplingParams(seed=1)):
        out, _ = _fused(p, x, 1, 3)
        assert out[flag] == 1.0 and out[5 - flag] == 0.0


def test_all_minus_inf_gives_no_finite_logprob():
    x = torch.full((600,), -math.inf)
    out, _ = _fused(SamplingParams(temperature=0), x, 1, 3)
    assert not math.isfinite(float(out[1]))


def test_which_requests_it_takes():
    from minfer.ops.cuda import draw

    assert draw.applies(SamplingParams(), 0) is None
    assert draw.applies(SamplingParams(temperature=0, top_k=0), 0) is None          # greedy: top_k unused
    assert "top_logprobs" in draw.applies(SamplingParams(), 2)
    assert "top_k 0" in draw.applies(SamplingParams(top_k=0), 0)
    assert "top_k 129" in draw.applies(SamplingParams(top_k=129), 0)
    assert "penalties" in draw.applies(SamplingParams(repeat_penalty=1.1), 0)
