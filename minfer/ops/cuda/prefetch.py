"""Prefill weight groups: one double-buffered bf16 scratch, and dequantization of the NEXT group
on a side CUDA stream while cuBLAS multiplies with this one (issue 7).

A "group" is the tuple of weights of one ops.linear / ops.linear_many call (q,k,v | o |
gate,up | down per layer, then the lm head). Its weights are dequantized, each by its own
type's kernel, into consecutive rows of ONE scratch buffer ([sum N_i, K]), so the group can
be multiplied by one GEMM.

Prediction: the calls of a prefill forward repeat in the same order every forward. The
Sequence remembers, for each group (by identity of the QWeight objects, held by weakref so a
freed model's ids cannot alias a new model's), the group called after it; after each call the
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

import re
import weakref

import torch

from minfer.ops import paths

# the weights the model passes to linear_many together, by GGUF name (llama/qwen2 blocks)
ATTN_GROUP = ("attn_q", "attn_k", "attn_v")
FFN_GROUP = ("ffn_gate", "ffn_up")
_planned: dict = {}        # weight name -> elements, from prepare_weight (the load-time plan)


def note_weight(name: str, n_elems: int) -> None:
    _planned[name] = n_elems


def buffer_limit_elems(dtype) -> int:
    """One buffer's cap: MINFER_GROUP_SCRATCH_MB (default 288 MiB: the 7B's gate+up group,
    37888 x 3584 bf16 = 259 MiB, fits; the lm head does not and is chunked)."""
    mb = paths.env_int("MINFER_GROUP_SCRATCH_MB", 288)
    return max(1 << 20, mb * (1 << 20) // torch.empty((), dtype=dtype).element_size())


def is_ffn_in(w) -> bool:
    """w is a gate or up weight (by its GGUF name)."""
    return (getattr(w, "name", "") or "").endswith(tuple(f"{n}.weight" for n in FFN_GROUP))


def ffn_grouped() -> bool:
    """gate and up as one group (MINFER_GROUP_FFN=1) or each alone (=0, the default): one
    group is one dequant launch fewer per layer; apart, the largest group is the largest single
    weight, so both scratch buffers shrink from 2 x 259 MiB to 2 x 130 MiB for the 7B, under
    issue 7's 0.5 GB aim. (gate and up were always multiplied by one GEMM each.)"""
    return paths.enabled("MINFER_GROUP_FFN", default=False)


def planned_group_elems(dtype=torch.bfloat16) -> int:
    """The largest group of the prepared weights that fits one buffer (q/k/v and gate/up by
    their GGUF names, every other weight alone)."""
    limit = buffer_limit_elems(dtype)
    sizes = []
    groups: dict = {}
    names = "|".join(ATTN_GROUP + (FFN_GROUP if ffn_grouped() else ()))
    for name, n in _planned.items():
        m = re.match(rf"(.*\.)({names})\.weight$", name)
        if m:
            kind = 0 if m.group(2) in ATTN_GROUP else 1
            groups[(m.group(1), kind)] = groups.get((m.group(1), kind), 0) + n
        else:
            sizes.append(n)
    sizes += list(groups.values())
    fit = [s for s in sizes if s <= limit]
    return max(fit) if fit else 0


class Sequence:
    """Which group follows which: successor[group] = the group called right after it last time.

    A forward repeats the same order, so after one forward every group predicts its successor
    (the last layer's down predicts the next forward's layer-0 q/k/v). Several call structures
    (an A/B run switching MINFER_FUSE_GROUPS, two models) keep their own entries: a switch
    costs one miss, not a new recording. Entries hold weakrefs and are verified by identity, so
    a freed model's ids cannot alias a new one's."""

    MAX_ENTRIES = 8192

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.succ: dict = {}         # ids of a group -> (weakrefs of it, weakrefs of its successor)
        self.prev = None             # weakrefs of the last group called

    @staticmethod
    def _alive_match(entry, ws) -> bool:
        return len(entry) == len(ws) and all(r() is w for r, w in zip(entry, ws))

    def _lookup(self, ws):
        """The weakrefs of the successor of group `ws`, or None."""
        hit = self.succ.get(tuple(id(w) for w in ws))
        if hit is None or not self._alive_match(hit[0], ws):
            return None
        return hit[1]

    def predicted(self):
        """The weights of the predicted next call, or None (unknown, or a freed weight)."""
        if self.prev is None:
            return None
        cur = tuple(r() for r in self.prev)
        if any(w is None for w in cur):
            return None
        nxt = self._lookup(cur)
        if nxt is None:
            return None
        ws = tuple(r() for r in nxt)
        return None if any(w is None for w in ws) else ws

    def observe(self, ws) -> str:
        """Advance with the actual call `ws`: 'expected' (it was the prediction), 'miss' (another
        group was predicted) or 'cold' (nothing was predicted); learns the successor."""
        pred = self.predicted()
        state = "cold" if pred is None else ("expected" if len(pred) == len(ws) and
                                             all(a is b for a, b in zip(pred, ws)) else "miss")
        entry = tuple(weakref.ref(w) for w in ws)
        if self.prev is not None:
            prev = tuple(r() for r in self.prev)
            if all(w is not None for w in prev):
                if len(self.succ) >= self.MAX_ENTRIES:
                    self.succ.clear()
                self.succ[tuple(id(w) for w in prev)] = (self.prev, entry)
        self.prev = entry
        return state


class Runner:
    """The two scratch buffers of one (device, dtype), their events, and the side stream."""

    def __init__(self, device, dtype):
        self.device = torch.device(device)
        self.dtype = dtype
        self.cuda = self.device.type == "cuda"
        self.bufs: list = [None, None]
        self.holds: list = [None, None]    # tuple of weights whose rows buffer b holds (valid content)
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
        want = max(n_elems, min(planned_group_elems(self.dtype), buffer_limit_elems(self.dtype)))
        if self.cuda and self.bufs[0] is not None:
            torch.cuda.synchronize(self.device)   # no stream may still use the old buffers
        self.bufs = [None, None]
        self.bufs = [torch.empty(want, dtype=self.dtype, device=self.device) for _ in range(2)]
        self.holds = [None, None]

    def _holds(self, b: int, ws) -> bool:
        h = self.holds[b]
        return h is not None and Sequence._alive_match(h, ws)

    # --- work on one buffer ---------------------------------------------------------------

    def _fill(self, b: int, ws, dequantize) -> None:
        """Rows of every weight of `ws` into buffer b (on the current stream)."""
        k = ws[0].shape[1]
        r0 = 0
        for w in ws:
            n = w.shape[0]
            dequantize(w, self.bufs[b][r0 * k:(r0 + n) * k].view(n, k))
            r0 += n
        self.holds[b] = tuple(weakref.ref(w) for w in ws)     # weakrefs: never keep a model alive

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


_runners: dict = {}


def runner(device, dtype) -> Runner:
    key = (str(device), dtype)
    r = _runners.get(key)
    if r is None:
        r = _runners[key] = Runner(device, dtype)
    return r


def scratch_bytes() -> int:
    return sum(r.nbytes() for r in _runners.values())


def reset() -> None:
    """Forget the recorded sequences and free the buffers (tests; a model reload)."""
    for r in _runners.values():
        if r.cuda and r.bufs[0] is not None:
            torch.cuda.synchronize(r.device)
    _runners.clear()
