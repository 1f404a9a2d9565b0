"""Which captured decode graph a step replays (runtime/cuda_graphs.py DecodeGraph), on the CPU
with torch's CUDA graph calls replaced by recorders: the short graph (captured over
KVCache.rows_view(128)) for positions below 128, the whole-cache graph from 128 on, each
captured once at its first step; one graph with the switch off, for a cache of no more than
128 rows, or for a cache without rows_view."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from minfer.ops import paths
from minfer.runtime import cuda_graphs as CG
from minfer.runtime.kv_cache import KVCache


class _Graph:
    def __init__(self):
        self.rows = None

    def replay(self):
        _Graph.replays.append(self.rows)


class _Stream:
    def wait_stream(self, s):
        pass


class _Model:
    device = torch.device("cpu")
    cfg = types.SimpleNamespace(head_dim=128)

    def forward(self, tok, step, cache, ctx):
        if _Graph.capturing is not None:
            _Graph.capturing.rows = cache.n_ctx      # the rows the captured forward saw
        assert step.start is None and step.positions is not None
        return torch.zeros(1, 4)


@pytest.fixture
def fake_cuda(monkeypatch):
    _Graph.replays, _Graph.capturing = [], None
    stream = _Stream()

    @contextlib.contextmanager
    def graph(g):
        _Graph.capturing = g
        yield
        _Graph.capturing = None

    monkeypatch.setattr(torch.cuda, "Stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    paths.reset()


def _run(dg, positions, short=True):
    for p in positions:
        dg.step(1, p, short=short)
    return _Graph.replays


def test_short_graph_below_128_then_the_whole_cache(fake_cuda):
    dg = CG.DecodeGraph(_Model(), KVCache(2, 4096, 1, 8))
    got = _run(dg, [16, 17, 126, 127, 128, 129, 3354, 5, 3355])
    assert got == [128, 128, 128, 128, 4096, 4096, 4096, 128, 4096]
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.capture"] == 2 and counts["graph.decode.capture.short"] == 1
    assert counts["graph.decode.replay"] == 9 and counts["graph.decode.replay.short"] == 5
    assert dg.graph.rows == 4096 and set(dg.graphs) == {0, 128}


@pytest.mark.parametrize("case", ["switch off", "small cache", "no rows_view"])
def test_one_graph(fake_cuda, case):
    cache = KVCache(2, 128 if case == "small cache" else 4096, 1, 8)
    if case == "no rows_view":
        cache = types.SimpleNamespace(n_ctx=cache.n_ctx, k=cache.k, v=cache.v)    # a cache of the bare protocol
    dg = CG.DecodeGraph(_Model(), cache)
    got = _run(dg, [3, 50, 127], short=case != "switch off")
    assert got == [cache.n_ctx] * 3
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.capture"] == 1 and "graph.decode.replay.short" not in counts
