"""Batched decode steps under CUDA graphs, one graph per batch-size bucket.

A decode-only step of n sequences is padded to the next bucket (1, 2, 4, ..., 256): padding rows
feed token 0 at position 0, write their keys/values into the reserved block 0 and attend to it
alone (paged_kv.py), and their logits are ignored. Everything a step changes lives in the
bucket's static device tensors (tokens, positions, slots, block tables, lengths), and no
kernel's grid depends on them (the paged decode kernel's grid comes from the block-table width,
a full context), so the graph captured at the first step of a bucket replays for every later
one. A recurrent model's decode rows read and write their state slots through the bucket's
static `state_slots` tensor (padding rows: slot 0), gathered and scattered by device indices
(models/mamba2.py conv_scan_batch), so the same holds for them; the warm-up runs before a capture
repeat a step at its positions, which the state rings allow (mamba2.py). The linear layers see
M = bucket rows: the GEMV up to the ops' gemv_max_m, dequantize + cuBLAS above it, both captured
inside the graph.

Off-switches: MINFER_CUDA_GRAPH=0 (Switches.cuda_graph) or BatchEngine(cuda_graphs=False) run
every step eagerly; a bucket whose capture fails runs eagerly from then on, counted as the fallback
`graph.batch_decode.replay`.
"""

from __future__ import annotations

import torch

from minfer.ops import paths
from minfer.runtime.paged_kv import PagedStep


class _Bucket:
    def __init__(self, n: int, max_blocks: int, device, states: bool = False) -> None:
        self.n = n
        self.tokens = torch.zeros(n, dtype=torch.long, device=device)
        self.step = PagedStep(
            positions=torch.zeros(n, dtype=torch.long, device=device),
            slots=torch.zeros(n, dtype=torch.long, device=device),
            n_decode=n,
            block_tables=torch.zeros((n, max_blocks), dtype=torch.int32, device=device),
            context_lens=torch.ones(n, dtype=torch.int32, device=device),
            chunks=[],
            logit_rows=torch.arange(n, dtype=torch.long, device=device),
            # recurrent state slots (paged_state.py), only where the cache keeps them
            state_slots=torch.zeros(n, dtype=torch.long, device=device) if states else None)
        self.graph = None
        self.logits = None
        self.failed = False

    def load(self, items, tokens, block_size: int, max_blocks: int) -> None:
        """The step's inputs into the static tensors, stream-ordered without a host wait (pinned
        copies): a held step may still be running (batch_engine.py). tokens: a host list, or a
        device tensor (a chained step's tokens, sampled by the step before)."""
        s = self.step
        host = PagedStep.build(items, block_size, "cpu", pad_decode_to=self.n, max_blocks=max_blocks,
                               states=s.state_slots is not None)
        if torch.is_tensor(tokens):
            if len(items) < self.n:
                self.tokens.zero_()
            self.tokens[:len(items)].copy_(tokens)
        else:
            _h2d(self.tokens, torch.tensor(tokens + [0] * (self.n - len(tokens)), dtype=torch.long))
        _h2d(s.positions, host.positions)
        _h2d(s.slots, host.slots)
        _h2d(s.block_tables, host.block_tables)
        _h2d(s.context_lens, host.context_lens)
        if s.state_slots is not None:
            _h2d(s.state_slots, host.state_slots)


def _h2d(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src.pin_memory() if dst.device.type == "cuda" else src, non_blocking=True)


class BatchDecodeGraphs:
    def __init__(self, engine, buckets: list[int]) -> None:
        self.engine = engine
        self.buckets = sorted(buckets)
        self._by_size: dict[int, _Bucket] = {}
        self.pool = None

    def _bucket_for(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def _forward(self, b: _Bucket) -> torch.Tensor:
        from minfer.models.base import Step

        eng = self.engine
        eng.cache.step = b.step
        ctx = eng.ctx
        if ctx is not None:
            # as the prefill graphs (runtime/prefill_graphs.py): no side-stream prefetch in a capture
            ctx = ctx.with_switches(prefetch=False, fuse_groups=False)
        return eng.model.forward(b.tokens, Step(b.step.positions, None, b.step.logit_rows), eng.cache, ctx)

    def _capture(self, b: _Bucket) -> None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):      # compile kernels, settle the allocator (writes go to real slots)
                self._forward(b)
        torch.cuda.current_stream().wait_stream(s)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            b.logits = self._forward(b)
        b.graph = g
        paths.count("graph.batch_decode.capture")

    def warm(self) -> int:
        """Capture every bucket's graph now, on padding rows only (they write the reserved block
        0): the first step of each batch size then replays instead of compiling kernels and
        capturing in the middle of serving or of a timed run. Returns the graphs captured."""
        eng = self.engine
        n = 0
        for size in self.buckets:
            b = self._get(size)
            if b.graph is not None or b.failed:
                continue
            b.load([], [], eng.cache.block_size, eng.max_blocks)
            n += self._try_capture(b)
        eng.cache.step = None
        torch.cuda.synchronize(eng.device)
        return n

    def _get(self, size: int) -> _Bucket:
        b = self._by_size.get(size)
        if b is None:
            b = self._by_size[size] = _Bucket(size, self.engine.max_blocks, self.engine.device,
                                              self.engine.cache.states is not None)
        return b

    def _try_capture(self, b: _Bucket) -> bool:
        """Capture b's graph; a failure marks the bucket eager from then on (counted fallback)."""
        try:
            self._capture(b)
            return True
        except RuntimeError as e:
            paths.fallback("graph.batch_decode.replay", f"capture failed: {str(e).splitlines()[0][:100]}")
            b.failed = True
            return False

    def run(self, items, tokens: list[int]) -> torch.Tensor | None:
        """Logits (bucket, V) of a decode-only step, or None when it must run eagerly."""
        size = self._bucket_for(len(items))
        if size is None:
            return None
        b = self._get(size)
        if b.failed:
            return None
        eng = self.engine
        b.load(items, tokens, eng.cache.block_size, eng.max_blocks)
        if b.graph is None and not self._try_capture(b):
            return None
        b.graph.replay()
        paths.count("graph.batch_decode.replay")
        eng.cache.step = None
        return b.logits
