"""One decode step captured in a CUDA graph.

Eager decode issues ~12 kernels per layer from Python (docs/perf-log.md section 5: 7.1 ms of
CPU time for 2.0 ms of GPU work on 4 layers of the 7B), so a step is launch-bound. A graph
replays the whole step's kernels with one call.

What makes the step capturable: every value that changes between steps lives in a device
tensor the graph reads -- the token id and its position, given to the model's one forward as
a Step without a host start (rope reads positions from memory, the cache writes with
index_copy_ at that position, decode attention reads its key count from memory) -- and no
kernel's grid or shapes depend on them (decode attention sizes its grid from the cache).

    g = DecodeGraph(model, cache, ctx)        # captures on first use
    logits = g.step(token_id, start_pos)      # (1, vocab) float32 on the GPU

The engine (runtime/engine.py) calls `step` for each generated token once the prompt is
prefilled, unless Switches.cuda_graph is off.
"""

from __future__ import annotations

import sys

import torch

from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.ops import paths


_InferenceMode = getattr(torch._C, "_InferenceMode", None)


def inference_scope():
    """torch.inference_mode() as a `with` context, without its decorator's per-call copy of
    itself: the decorator costs ~3.8 us a call on this project's CPU machine, the guard 1.5, and
    a decode token entered two of them (perf-log V6). Falls back to torch.inference_mode()
    where torch has no such guard."""
    return _InferenceMode(True) if _InferenceMode is not None else torch.inference_mode()


class DecodeGraph:
    def __init__(self, model, cache, ctx=None):
        self.model = model
        self.cache = cache
        self.ctx = ctx
        dev = model.device
        self.inp = torch.zeros(2, dtype=torch.int64, device=dev)
        self.tok = self.inp[0:1]                                     # the step's token id
        self.pos = self.inp[1:2]                                     # its position
        # pinned mode: both written into pinned host memory and sent in one async copy (no fill
        # kernels); `sent` marks that copy so the host buffer is not rewritten before it ran
        self.inp_host = None
        self.sent = None
        # the last input copy may not have read inp_host yet (until the host synchronizes); whether
        # `sent` was recorded after it (else a stream synchronize is the wait)
        self.unsynced = False
        self.sent_recorded = False
        self.out = None              # the pinned logits buffer to_host reuses once the caller let go of it
        # captured graphs by the cache rows they see: 0 the whole cache; `short` rows (a view of
        # the cache's first rows) for the positions below them, where the decode attention is one
        # key split and writes its output with no merge launch (Switches.decode_short_graph)
        self.graphs: dict[int, tuple] = {}
        # io graphs (Switches.graph_io), by (rows as above, slot): the same step with the pinned
        # input copy as its first node and the logits copy into io_outs[slot] (pinned) as its last,
        # for a caller that reads the logits on the host and synchronizes after each step
        # (Engine.forward): a token is then the host's writes, one replay call and one synchronize.
        # Two slots: a loop `x = eng.forward(...)` still holds the last step's tensor during the
        # call, so its steps alternate between the two (a caller that lets go uses slot 0 only)
        self.io_graphs: dict[tuple[int, int], tuple] = {}
        self.io_outs: list = [None, None]  # each slot's pinned (1, V) float32 logits
        self.io_slot = None          # the last step's io slot (to_host: nothing to copy), or None
        self._short = None           # short_rows(), once asked
        self.graph = None            # the last step's graph and its logits buffer
        self.logits = None

    def _forward(self, cache) -> torch.Tensor:
        """The model's forward with the token and position read from device memory."""
        return self.model.forward(self.tok, Step(self.pos, None, "all"), cache, self.ctx)   # (1, V)

    def short_rows(self) -> int:
        """Rows of the short graph: two key tiles of the decode attention (one split), when the
        cache is a KVCache with more rows than that; else 0 (none)."""
        from minfer.ops.cuda.attention import one_split_rows

        rows = one_split_rows(self.model.cfg.head_dim)
        return rows if hasattr(self.cache, "rows_view") and rows < self.cache.n_ctx else 0

    def capture(self, rows: int = 0, slot: int | None = None) -> None:
        # warm up on a side stream (compiles the kernels, settles the allocator), then capture.
        # tok/pos already hold the real first step, so the warm-up writes the right keys and
        # values at that position (the replay writes the same again).
        # slot (an io graph): the input copy from inp_host and the logits copy into io_outs[slot]
        # captured with it (both pinned, so each is a memcpy node of the graph, reading / writing
        # host memory when the node runs).
        cache = self.cache.rows_view(rows) if rows else self.cache
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                warm = self._forward(cache)
        torch.cuda.current_stream().wait_stream(s)
        io = slot is not None
        if io and self.io_outs[slot] is None:
            self.io_outs[slot] = _pinned(warm.shape, torch.float32)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            if io:
                self.inp.copy_(self.inp_host, non_blocking=True)
            logits = self._forward(cache)
            if io:
                self.io_outs[slot].copy_(logits, non_blocking=True)
        if io:
            self.io_graphs[rows, slot] = (graph, logits)
        else:
            self.graphs[rows] = (graph, logits)
        paths.count("graph.decode.capture")
        if rows:
            paths.count("graph.decode.capture.short")
        if io:
            paths.count("graph.decode.capture.io")

    def step(self, token_id: int, start_pos: int, pinned: bool = False,
             token_dev: torch.Tensor | None = None, host_sync: bool = False, short: bool = False,
             io: bool = False) -> torch.Tensor:
        """Feed one token at position start_pos (the cache holds [0, start_pos)); returns the
        graph's (1, vocab) float32 logits buffer (overwritten by the next step: copy to keep).
        pinned: token and position sent in one copy from pinned host memory (Switches.pinned_io)
        instead of two fill kernels. token_dev: the token as a (1,) int64 device tensor, copied
        on the device after the inputs (token_id is then ignored): a token sampled on the GPU
        is fed before the host has read it. host_sync: the caller synchronizes the stream after
        this step (to_host does), so the pinned input copy records no event: the next step
        waits on the event only if one was recorded, else on the stream, and not at all after
        to_host (Switches.graph_host_reuse; an event record is ~8 us on the H200 machines' CPUs).
        short (Switches.decode_short_graph): positions below short_rows() replay the graph
        captured over that many rows (each graph is captured at its first step).
        io (Switches.graph_io; with pinned and host_sync, no token_dev): replay the io graph, whose
        own nodes copy the input in and the logits out to its slot's pinned tensor, the first slot
        whose tensor the caller has let go of (else the plain graph, counted graph.decode.io_held);
        to_host then only synchronizes."""
        with inference_scope():
            return self._step(token_id, start_pos, pinned, token_dev, host_sync, short, io)

    def _step(self, token_id: int, start_pos: int, pinned: bool = False,
              token_dev: torch.Tensor | None = None, host_sync: bool = False, short: bool = False,
              io: bool = False) -> torch.Tensor:
        if start_pos >= self.cache.n_ctx:
            raise MinferError(f"position {start_pos} is past the KV cache of {self.cache.n_ctx} positions")
        rows = 0
        if short:
            if self._short is None:
                self._short = self.short_rows()
            # (the short graph's attention reads the key count from the position, so at a later
            # position it would read the whole cache through the view's storage in one split:
            # right, but ~48 us a layer slower at 3k keys on the 7B -- never replayed there)
            rows = self._short if start_pos < self._short else 0
        if pinned:
            if self.inp_host is None:
                self.inp_host = _pinned((2,), torch.int64).zero_()
                self.inp_np = self.inp_host.numpy()
                self.sent = _event()
            if self.unsynced:                    # the previous step's copy must have read the buffer
                if self.sent_recorded:
                    self.sent.synchronize()
                else:
                    torch.cuda.current_stream().synchronize()
            self.inp_np[0] = int(token_id)
            self.inp_np[1] = int(start_pos)
            slot = None
            if io and host_sync and token_dev is None:
                # (the tensor read straight from the list: a name bound to it would count as a holder)
                slot = next((i for i in (0, 1) if self.io_outs[i] is None or _unshared(self.io_outs[i])), None)
                if slot is None:                 # the caller still holds both slots' logits
                    paths.count("graph.decode.io_held")
            key = rows if slot is None else (rows, slot)
            graphs = self.graphs if slot is None else self.io_graphs
            if slot is None or key not in graphs:   # (an io graph's first capture: the warm-up reads inp)
                self.inp.copy_(self.inp_host, non_blocking=True)
            self.unsynced = True
            self.sent_recorded = not host_sync
            if not host_sync:
                self.sent.record()
        else:
            slot, key, graphs = None, rows, self.graphs
            self.tok.fill_(int(token_id))
            self.pos.fill_(int(start_pos))
        if token_dev is not None:
            self.tok.copy_(token_dev.reshape(1))
        if key not in graphs:
            self.capture(rows, slot)
        self.graph, self.logits = graphs[key]
        self.graph.replay()
        self.io_slot = slot
        paths.count("graph.decode.replay")
        if rows:
            paths.count("graph.decode.replay.short")
        if slot is not None:
            paths.count("graph.decode.replay.io")
        return self.logits

    def to_host(self, logits: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """The logits in a pinned CPU tensor, one DMA (a pageable copy is staged by the driver
        through its own buffer), then the stream synchronized. reuse (Switches.graph_host_reuse):
        the previous call's tensor is written again when nothing outside this object refers to it
        or to its memory (no view, no numpy array; counted as graph.decode.logits_reused), else a
        new one (torch's caching host allocator: an allocation and an event per step) becomes the
        kept one; the caller's tensor is never overwritten. After an io step (`logits` its graph's)
        the graph copied the logits into its slot's tensor itself: only the synchronize."""
        if self.io_slot is not None and logits is self.logits:
            torch.cuda.current_stream().synchronize()
            self.unsynced = False
            return self.io_outs[self.io_slot]
        out = self.out if reuse and self.out is not None and _unshared(self.out) else None
        if out is None:
            out = _pinned(logits.shape, torch.float32)
            if reuse:
                self.out = out
        else:
            paths.count("graph.decode.logits_reused")
        out.copy_(logits, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        self.unsynced = False
        return out


def _pinned(shape, dtype) -> torch.Tensor:
    """A page-locked host tensor (torch's caching host allocator). A function of its own so that
    the CPU tests of the graph choice can stand in plain memory."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def _event():
    return torch.cuda.Event()


def _unshared(t: torch.Tensor) -> bool:
    """Nothing but DecodeGraph.out refers to t or to its storage: the tensor object has no other
    reference (getrefcount: the attribute, the argument, this call's own) and its storage no
    other user (a view or a numpy array holds one; the temporary storage object counts one).
    torch's use count is a private call: without it, never (a new buffer each time)."""
    use = getattr(torch._C, "_storage_Use_Count", None)
    return (use is not None and sys.getrefcount(t) <= 3
            and use(t.untyped_storage()._cdata) <= 2)
