"""Prefill weight groups: one double-buffered bf16 scratch, and dequantization of the NEXT group
on a side CUDA stream while cuBLAS multiplies with this one (docs/perf-log.md section 7).

The classes here are owned by an engine's Workspace (workspace.py); nothing in this module is
shared between engines. A "group" is the tuple of weights of one ops.linear / ops.linear_many
call (q,k,v | o | gate | up | down per layer, then the lm head). Its weights are dequantized, each by its own
type's kernel, into consecutive rows of ONE scratch buffer ([sum N_i, K]), so the group can
be multiplied by one GEMM.

Prediction: the calls of a prefill forward repeat in the same order every forward. The
Sequence remembers, for each group (the tuple of QWeight objects, which hash by identity; the
workspace lives as long as its engine's model), the group called after it; after each call the
runner dequantizes the predicted successor into the other buffer on a side stream (after the
last layer's down: the next forward's layer-0 q/k/v). A call that is not the prediction is
dequantized synchronously (`prefetch.miss`) and the successor is relearned. Hits count
`prefetch.hit`; calls with no prediction (the first forward) count nothing.

Stream safety (two events per buffer):
- ready[b] is recorded on the side stream after its dequant into b; the main stream waits
  on it before a GEMM (or a synchronous dequant) touches b;
- free[b] is recorded on the main stream after the last GEMM that reads b; the side stream
  waits on it before overwriting b.
The two buffers are allocated once on the main stream and never freed while in use (a
larger need synchronizes the device first), so the caching allocator never hands their
memory to another stream's tensor; GEMM outputs are allocated on the main stream.
On the CPU (Triton's interpreter, the tests) the side-stream work runs inline, with the same
bookkeeping, so hits and the content of prefetched buffers are testable without a GPU.
"""

from __future__ import annotations

import torch

from minfer.ops import paths


class Sequence:
    """Which group follows which: succ[group] = the group called right after it last time.

    A forward repeats the same order, so after one forward every group predicts its successor
    (the last layer's down predicts the next forward's layer-0 q/k/v). Several call structures
    (an A/B run switching fuse_groups) keep their own entries: a switch costs one miss, not a
    new recording. Groups are tuples of weights that hash and compare by identity."""

    MAX_ENTRIES = 8192

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.succ: dict = {}         # group -> the group called after it
        self.prev = None             # the last group called

    @staticmethod
    def same(a, b) -> bool:
        return a is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b))

    def predicted(self):
        """The weights of the predicted next call, or None (unknown)."""
        if self.prev is None:
            return None
        return self.succ.get(self.prev)

    def observe(self, ws) -> str:
        """Advance with the actual call `ws`: 'expected' (it was the prediction), 'miss' (another
        group was predicted) or 'cold' (nothing was predicted); learns the successor."""
        ws = tuple(ws)
        pred = self.predicted()
        state = "cold" if pred is None else ("expected" if self.same(pred, ws) else "miss")
        if self.prev is not None:
            if len(self.succ) >= self.MAX_ENTRIES:
                self.succ.clear()
            self.succ[self.prev] = ws
        self.prev = ws
        return state


class Runner:
    """The two scratch buffers of one (device, dtype), their events, and the side stream."""

    def __init__(self, device, dtype, planned_elems: int, limit_elems: int):
        self.device = torch.device(device)
        self.dtype = dtype
        self.planned_elems = planned_elems    # the largest planned group that fits one buffer
        self.limit_elems = limit_elems        # one buffer's cap (Switches.group_scratch_mb)
        self.cuda = self.device.type == "cuda"
        self.bufs: list = [None, None]
        self.holds: list = [None, None]    # the group whose rows buffer b holds (valid content)
        self.last = 1                       # the buffer the last call used
        self.seq = Sequence()
        if self.cuda:
            self.side = torch.cuda.Stream(device=self.device)
            self.ready = [torch.cuda.Event(), torch.cuda.Event()]
            self.free = [torch.cuda.Event(), torch.cuda.Event()]

    def capacity(self) -> int:
        return 0 if self.bufs[0] is None else self.bufs[0].numel()

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.bufs if b is not None)

    def ensure(self, n_elems: int) -> None:
        if self.capacity() >= n_elems:
            return
        want = max(n_elems, min(self.planned_elems, self.limit_elems))
        if self.cuda and self.bufs[0] is not None:
            torch.cuda.synchronize(self.device)   # no stream may still use the old buffers
        self.bufs = [None, None]
        self.bufs = [torch.empty(want, dtype=self.dtype, device=self.device) for _ in range(2)]
        self.holds = [None, None]

    def _holds(self, b: int, ws) -> bool:
        return Sequence.same(self.holds[b], ws)

    # --- work on one buffer ---------------------------------------------------------------

    def _fill(self, b: int, ws, dequantize) -> None:
        """Rows of every weight of `ws` into buffer b (on the current stream)."""
        k = ws[0].shape[1]
        r0 = 0
        for w in ws:
            n = w.shape[0]
            dequantize(w, self.bufs[b][r0 * k:(r0 + n) * k].view(n, k))
            r0 += n
        self.holds[b] = tuple(ws)

    def _prefetch(self, b: int, ws, dequantize) -> None:
        if self._holds(b, ws):
            return                                   # already there (weights never change)
        if not self.cuda:
            self._fill(b, ws, dequantize)
            return
        self.holds[b] = None
        with torch.cuda.stream(self.side):
            self.side.wait_event(self.free[b])       # the last GEMM reading b has finished
            self._fill(b, ws, dequantize)
            self.ready[b].record(self.side)

    def acquire(self, ws, total_elems: int, dequantize, prefetch: bool) -> int:
        """A buffer holding the rows of `ws`, ready for the main stream; returns its index."""
        self.ensure(total_elems)
        state = self.seq.observe(ws) if prefetch else "off"
        b = next((i for i in (0, 1) if self._holds(i, ws)), None)
        if state == "expected" and b is not None:
            paths.count("prefetch.hit")
        elif state in ("expected", "miss"):
            paths.count("prefetch.miss")
        if b is None:
            b = 1 - self.last
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self.ready[b])
            self._fill(b, ws, dequantize)
        elif self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[b])
        self.last = b
        return b

    def release(self, b: int, dequantize, fits) -> None:
        """After the GEMMs reading buffer b were enqueued: mark it, prefetch the next group."""
        if self.cuda:
            self.free[b].record(torch.cuda.current_stream(self.device))
        nxt = self.seq.predicted()
        if nxt is not None and fits(nxt):
            self._prefetch(1 - b, nxt, dequantize)

    def release_no_prefetch(self, b: int) -> None:
        if self.cuda:
            self.free[b].record(torch.cuda.current_stream(self.device))

    def plain_scratch(self, ws, prefetch: bool, need: int):
        """A whole buffer as a plain scratch for a weight too big for it (chunked, the lm head).

        The sequence still advances (so the call after it is predicted); the buffer's content
        is forgotten. Returns (index, 1-D buffer); call release(index, ...) after the GEMMs."""
        self.ensure(need)
        if prefetch:
            self.seq.observe(ws)
        b = 1 - self.last
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[b])
        self.holds[b] = None
        self.last = b
        return b, self.bufs[b]

