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
    input in and the logits out; no copy launched around it), one per (rows, slot), and to_host
    hands back that slot's pinned tensor. Slot 0 while the caller lets go of it; slot 1 while the
    caller holds slot 0's (a loop `x = eng.forward(...)`: its steps alternate); the plain graph,
    with its input copy launched by the step, while the caller holds both (graph.decode.io_held);
    a step the host does not synchronize after never takes an io graph."""
    monkeypatch.setattr(CG, "_pinned", lambda shape, dtype: torch.empty(shape, dtype=dtype))
    monkeypatch.setattr(CG, "_event", _Event)
    dg = CG.DecodeGraph(_Model(), KVCache(2, 4096, 1, 8))
    kw = dict(pinned=True, host_sync=True, short=True, io=True)
    for p in [16, 17, 127, 128, 129]:
        lg = dg.step(1, p, **kw)
        assert dg.to_host(lg, reuse=True) is dg.io_outs[0]
        assert int(dg.inp_host[1]) == p
    assert _Graph.replays == [128, 128, 128, 4096, 4096]
    assert set(dg.io_graphs) == {(128, 0), (0, 0)} and not dg.graphs
    assert int(dg.inp[1]) == 128          # copied in only before the captures: the graphs copy it
    x = dg.to_host(dg.step(1, 130, **kw), reuse=True)
    for p in (131, 132, 133):             # x = forward(...): x is held during the next call
        x = dg.to_host(dg.step(1, p, **kw), reuse=True)
        assert x is dg.io_outs[(p - 130) % 2]
    assert set(dg.io_graphs) == {(128, 0), (0, 0), (0, 1)} and not dg.graphs
    held = [x, dg.to_host(dg.step(1, 134, **kw), reuse=True)]   # the caller keeps two steps
    assert held[1] is dg.io_outs[0]
    other = dg.to_host(dg.step(1, 135, **kw), reuse=True)      # both slots held
    assert all(other is not t for t in dg.io_outs)
    assert set(dg.graphs) == {0}
    assert int(dg.inp[1]) == 135          # the plain graph's input copy, launched by the step
    del other, held, x
    assert dg.to_host(dg.step(1, 136, **kw), reuse=True) is dg.io_outs[0]
    dg.step(1, 137, pinned=True, host_sync=False, short=True, io=True)
    assert dg.graph is dg.graphs[0][0]
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.replay.io"] == 11 and counts["graph.decode.io_held"] == 1
    assert counts["graph.decode.capture.io"] == 3 and counts["graph.decode.replay"] == 13
