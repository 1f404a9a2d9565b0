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

    def synchronize(self):
        pass


class _Event:
    def record(self):
        pass

    def synchronize(self):
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


def test_io_graphs_while_the_caller_lets_go(fake_cuda, monkeypatch):
    """Switches.graph_io: a host-synchronized pinned step replays an io graph (its own nodes copy the
    input in and the logits out; no copy launched around it), one per rows like the plain graphs,
    and to_host hands back the io graphs' one pinned tensor; while the caller holds that tensor a
    step replays the plain graph instead (graph.decode.io_held) and to_host gives another tensor;
    a step the host does not synchronize after never takes an io graph."""
    monkeypatch.setattr(CG, "_pinned", lambda shape, dtype: torch.empty(shape, dtype=dtype))
    monkeypatch.setattr(CG, "_event", _Event)
    dg = CG.DecodeGraph(_Model(), KVCache(2, 4096, 1, 8))
    kw = dict(pinned=True, host_sync=True, short=True, io=True)
    for p in [16, 17, 127, 128, 129]:
        lg = dg.step(1, p, **kw)
        assert dg.to_host(lg, reuse=True) is dg.io_out
        assert int(dg.inp_host[1]) == p
    assert _Graph.replays == [128, 128, 128, 4096, 4096]
    assert set(dg.io_graphs) == {0, 128} and not dg.graphs
    assert int(dg.inp[1]) == 128          # copied in only before the captures: the graphs copy it
    held = dg.to_host(dg.step(1, 130, **kw), reuse=True)
    assert held is dg.io_out
    other = dg.to_host(dg.step(1, 131, **kw), reuse=True)
    assert other is not held and set(dg.graphs) == {0}
    assert int(dg.inp[1]) == 131          # the plain graph's input copy, launched by the step
    del other, held
    assert dg.to_host(dg.step(1, 132, **kw), reuse=True) is dg.io_out
    dg.step(1, 133, pinned=True, host_sync=False, short=True, io=True)
    assert dg.graph is dg.graphs[0][0]
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.replay.io"] == 7 and counts["graph.decode.io_held"] == 1
    assert counts["graph.decode.capture.io"] == 2 and counts["graph.decode.replay"] == 9
