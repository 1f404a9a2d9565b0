"""Pinned MoE routing for bf16-against-float32 comparisons (tests/gpu/test_arch_gpu.py).

A router's top-k is a discontinuous function: where two experts' selection scores are a near-tie,
bf16 rounding anywhere upstream picks the other expert, and that row's output jumps by the
difference of two experts (on the CPU, the bf16 reference of qwen3next / dots1 / deepseek2 flips
1-3 of their prefill choices and lands 0.107 / 0.180 / 0.123 from float32; with the float32 run's
choices pinned, 0.030 / 0.028 / 0.034). Whether a flip happens depends on where each
implementation rounds, so an unpinned bf16 comparison on a tiny random fixture measures luck. With
every run's choices pinned to the float32 reference's, the comparison measures the rounding of
everything else, and a wrong kernel still shows.

How: reference.route (which both backends call, ops/cuda/moe.py included) is wrapped; a pinned
call adds a (T, E) bias of 1e4 on the pinned experts to its select_bias. The selection (and a
grouped router's group choice) then takes them, while the weights still come from the run's own
probabilities (select_bias never enters the weights: llama.cpp's build_moe_ffn, reference.route).
The pins live in one device buffer (calls, rows, k) that the wrapper slices: a decode step
captured in a CUDA graph reads whatever the buffer holds at replay, so `load` before each forward
pins that step. Every forward calls route once per MoE layer in the same order (`calls` of them),
so a counter modulo `calls` names the call; the engine's warm-up and capture forwards keep it
aligned. gating "topk_softmax" (gpt-oss) takes no select_bias: such calls are not pinned
(`unpinned` counts them).
"""

from __future__ import annotations

import contextlib

import torch

PIN = 1e4


@contextlib.contextmanager
def _wrapped_route(wrap):
    """reference.route replaced by wrap(the real route) inside, restored after."""
    from minfer.ops import reference

    real = reference.route
    reference.route = wrap(real)
    try:
        yield
    finally:
        reference.route = real


class RoutePins:
    def __init__(self):
        self.recorded: list[torch.Tensor] = []      # record mode: every call's (T, k) ids, CPU
        self.buf = None                             # pin mode: (calls, rows, k) int64 on the device
        self.calls = 0
        self.n = 0
        self.unpinned = 0
        self.pinned_calls = 0

    @contextlib.contextmanager
    def recording(self):
        def wrap(real):
            def route(*a, **kw):
                w, idx = real(*a, **kw)
                self.recorded.append(idx.detach().cpu())
                return w, idx
            return route
        with _wrapped_route(wrap):
            yield self

    def take(self, n_calls: int) -> list[torch.Tensor]:
        """The last forward's n_calls recorded choices (older ones dropped)."""
        out, self.recorded = self.recorded[-n_calls:], []
        return out

    @contextlib.contextmanager
    def pinning(self, calls: int, rows: int, k: int, device):
        self.calls, self.n = calls, 0
        self.buf = torch.zeros((calls, rows, k), dtype=torch.long, device=device)
        with _wrapped_route(self._pinned):
            yield self

    def _pinned(self, real):
        def route(h, router, k_, norm_weights, router_bias=None, gating="softmax", select_bias=None, *a, **kw):
            j = self.n % self.calls
            self.n += 1
            if gating == "topk_softmax":
                self.unpinned += 1
                return real(h, router, k_, norm_weights, router_bias, gating, select_bias, *a, **kw)
            T, E = h.shape[0], router.shape[0]
            b = torch.zeros((T, E), dtype=torch.float32, device=h.device).scatter_(1, self.buf[j, :T], PIN)
            sb = b if select_bias is None else b + select_bias.float()
            self.pinned_calls += 1
            w, idx = real(h, router, k_, norm_weights, router_bias, gating, sb, *a, **kw)
            if not (idx.is_cuda and torch.cuda.is_current_stream_capturing()):   # eager: the pins were taken
                assert torch.equal(idx.sort(-1).values, self.buf[j, :T].sort(-1).values), (j, idx, self.buf[j, :T])
            return w, idx
        return route

    def load(self, pins: list[torch.Tensor]) -> None:
        """Pin the next forward's calls to `pins` (one (T, k) tensor per call, in call order)."""
        assert len(pins) == self.calls, (len(pins), self.calls)
        for j, p in enumerate(pins):
            self.buf[j, :p.shape[0]].copy_(p.to(self.buf.device))
        if self.buf.is_cuda:
            torch.cuda.synchronize()
