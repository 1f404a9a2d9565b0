"""Short prompts' prefill captured in CUDA graphs, one per padded length.

Why: from ~32 to ~1k tokens a 7B prefill is bound by the host, not the GPU (docs/perf-log.md
section 8: one eager prefill of 512 tokens took ~52 ms of wall time for ~20 ms of GPU work,
~600 kernels issued from Python). A graph replays all of them with one call. Above
Switches.prefill_graph_max tokens (default 1024) the GPU work dominates and the eager path
(with its prefetching and fused groups) runs.

A prompt of T tokens is padded to Tb = T rounded up to ops.LENGTH_BUCKET (padding id 0 at
positions T..Tb-1), so one graph serves all lengths of its bucket. The padding cannot change
the real rows (causal attention) and the keys it leaves in the cache lie past the real tokens,
where decode steps write before they read. The last real row is picked by a device index
(the Step's logits rows). At most Switches.prefill_graphs graphs (default 2) are kept, least
recently used dropped, each with its memory pool (activations of Tb tokens: ~0.2 GB for the 7B
at Tb=512).

Capture-time rules: the weights are dequantized by the single-scratch path (the capture's
context is the engine's with prefetch and fuse_groups off: their cross-stream events and
'buffer still holds these weights' shortcuts are host decisions a replay could not repeat),
and the captured forward always starts at position 0.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from minfer.models.base import Step
from minfer.ops import LENGTH_BUCKET, paths
from minfer.ops.context import DEFAULT


class _Entry:
    def __init__(self, tb: int, device):
        self.tb = tb
        self.tok = torch.zeros(tb, dtype=torch.int64, device=device)
        self.pos = torch.arange(tb, dtype=torch.int64, device=device)
        self.last = torch.zeros(1, dtype=torch.int64, device=device)
        self.graph = None
        self.logits = None


class PrefillGraphs:
    def __init__(self, model, cache, ctx=None):
        self.model = model
        self.cache = cache
        self.ctx = ctx or DEFAULT
        self.device = model.device
        self.entries: OrderedDict[int, _Entry] = OrderedDict()

    @staticmethod
    def bucket(t: int) -> int:
        return -(-t // LENGTH_BUCKET) * LENGTH_BUCKET

    def fits(self, t: int) -> bool:
        # Prompts of at most gemv_max_m tokens stay eager: their matmuls are the decode GEMVs
        # (float32 sums over the raw blocks), and a graph of their padded length would run
        # dequant-to-bf16 + cuBLAS instead -- other numerics than the eager path, which flipped
        # near-tied greedy tokens of a synthetic model (docs/perf-log.md section 8).
        sw = self.ctx.switches
        return sw.gemv_max_m < t <= sw.prefill_graph_max and self.bucket(t) <= self.cache.n_ctx

    def _forward(self, e: _Entry, ctx) -> torch.Tensor:
        return self.model.forward(e.tok, Step(e.pos, 0, e.last), self.cache, ctx)

    def _capture(self, tb: int) -> _Entry:
        keep = max(1, self.ctx.switches.prefill_graphs)
        while len(self.entries) >= keep:
            self.entries.popitem(last=False)          # frees that graph's memory pool
        e = _Entry(tb, self.device)
        ctx = self.ctx.with_switches(prefetch=False, fuse_groups=False)
        s = torch.cuda.Stream(device=self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for _ in range(2):                        # compile kernels, size the scratch
                self._forward(e, ctx)
        torch.cuda.current_stream(self.device).wait_stream(s)
        e.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(e.graph):
            e.logits = self._forward(e, ctx)
        paths.count("graph.prefill.capture")
        self.entries[tb] = e
        return e
    @torch.inference_mode()
    def run(self, tokens: list[int]) -> torch.Tensor:
        """Prefill `tokens` from position 0; (1, V) float32 logits of the last one, on the GPU
        (the graph's buffer: copy to keep)."""
        t = len(tokens)
        tb = self.bucket(t)
        e = self.entries.get(tb)
        if e is None:
            e = self._capture(tb)                     # warm-up and capture write the cache; the replay rewrites it
        else:
            self.entries.move_to_end(tb)
        padded = torch.zeros(tb, dtype=torch.int64)
        padded[:t] = torch.tensor(tokens, dtype=torch.int64)
        e.tok.copy_(padded)
        e.last.fill_(t - 1)
        e.graph.replay()
        paths.count("graph.prefill.replay")
        return e.logits
