"""ops.moe_ffn's router options for deepseek2 (V3) and glm4moe: sigmoid gating, the selection
bias, group-limited choice and the weights scale (reference.route, which the CUDA backend calls
as is). Checked against a per-token loop written from the rules in llama.cpp's build_moe_ffn
(src/llama-graph.cpp) and DeepSeek-V3's modeling_deepseek.py MoEGate, and on a case worked by
hand."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.ops import reference


def _by_token(logits, k, norm, select_bias, n_group, topk_group, scale):
    """The router for one token at a time, in plain Python floats."""
    out_w, out_i = [], []
    for row in logits.tolist():
        E = len(row)
        p = [1 / (1 + math.exp(-v)) for v in row]
        s = [p[e] + (float(select_bias[e]) if select_bias is not None else 0.0) for e in range(E)]
        if n_group > 1:
            size = E // n_group
            score = [sum(sorted(s[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
            keep = sorted(range(n_group), key=lambda g: -score[g])[:topk_group]
            s = [s[e] if e // size in keep else -math.inf for e in range(E)]
        idx = sorted(range(E), key=lambda e: -s[e])[:k]
        w = [p[e] for e in idx]
        if norm:
            tot = max(sum(w), 6.103515625e-5)
            w = [x / tot for x in w]
        w = [x * scale for x in w]
        out_w.append(w)
        out_i.append(idx)
    return torch.tensor(out_w), torch.tensor(out_i)


def _route(logits, k, norm, **kw):
    """reference.route on logits given directly (h = identity rows, router = logits^T)."""
    T, E = logits.shape
    router = torch.zeros(E, max(E, T))
    router[:, :T] = logits.t()                   # eye[:T] @ router^T = logits
    return reference.route(torch.eye(max(E, T))[:T], router, k, norm, gating="sigmoid", **kw)


@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (4, 2), (8, 3)])
@pytest.mark.parametrize("norm,scale", [(True, 2.5), (False, 1.0)])
def test_sigmoid_route_matches_the_rules(n_group, topk_group, norm, scale):
    g = torch.Generator().manual_seed(n_group * 10 + topk_group)
    T, E, k = 16, 32, 6
    logits = torch.randn(T, E, generator=g) * 2
    bias = torch.randn(E, generator=g) * 0.3
    w, idx = _route(logits, k, norm, select_bias=bias, n_group=n_group, topk_group=topk_group,
                    weights_scale=scale)
    ew, ei = _by_token(logits, k, norm, bias, n_group, topk_group, scale)
    # top-k order among exact ties may differ; compare as sets with their weights
    for t in range(T):
        got = dict(zip(idx[t].tolist(), w[t].tolist()))
        want = dict(zip(ei[t].tolist(), ew[t].tolist()))
        assert got.keys() == want.keys(), t
        for e in want:
            assert got[e] == pytest.approx(want[e], rel=1e-5, abs=1e-7)


def test_bias_chooses_but_does_not_weight():
    """Worked by hand: E=4, two groups of two, k=2, one group kept. p = sigmoid(l):
    p = (0.731, 0.953, 0.731, 0.731). Unbiased, group 0 scores 1.684 > group 1's 1.462: experts
    0 and 1. A bias of +0.6 on experts 2 and 3 lifts group 1 to 2.662: experts 2 and 3, weighted
    by their unbiased p."""
    logits = torch.tensor([[1.0, 3.0, 1.0, 1.0]])
    p = torch.sigmoid(logits)[0]
    w, idx = _route(logits, 2, False, n_group=2, topk_group=1)
    assert sorted(idx[0].tolist()) == [0, 1]
    bias = torch.tensor([0.0, 0.0, 0.6, 0.6])
    w, idx = _route(logits, 2, False, select_bias=bias, n_group=2, topk_group=1)
    assert sorted(idx[0].tolist()) == [2, 3]
    assert w[0].tolist() == pytest.approx([float(p[2]), float(p[3])])
    w, idx = _route(logits, 2, True, select_bias=bias, n_group=2, topk_group=1)
    assert w[0].tolist() == pytest.approx([0.5, 0.5])


def test_group_mask_changes_the_choice():
    """On these logits the group-limited choice differs from the plain top-k: the mask is active."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 32, generator=g) * 2
    _, a = _route(logits, 6, True, n_group=8, topk_group=2)
    _, b = _route(logits, 6, True)
    assert any(set(x) != set(y) for x, y in zip(a.tolist(), b.tolist()))


def test_scale_and_norm_order():
    """Normalized weights sum to the scale; 0 and 1 mean no scale (llama.cpp's w_scale)."""
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    for scale, total in ((2.5, 2.5), (1.0, 1.0), (0.0, 1.0)):
        w, _ = _route(logits, 3, True, weights_scale=scale)
        assert w.sum(-1).tolist() == pytest.approx([total] * 4, rel=1e-6)


def test_softmax_route_unchanged():
    """The qwen3moe gating keeps its rule: softmax over E, the top k, renormalized."""
    g = torch.Generator().manual_seed(2)
    h, router = torch.randn(5, 16, generator=g), torch.randn(8, 16, generator=g)
    w, idx = reference.route(h, router, 2, True)
    p = torch.softmax(h @ router.t(), -1)
    top = p.topk(2, -1)
    assert torch.equal(idx, top.indices)
    assert torch.allclose(w, top.values / top.values.sum(-1, keepdim=True))
