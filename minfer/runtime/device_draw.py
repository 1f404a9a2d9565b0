"""The single-sequence engine's choice of the next token on CUDA (generate.generate's `draw`).

It is the batch engine's draw (runtime/batch_sampling.sample_rows) for one row: penalties,
top-k, top-p, min-p, temperature and a counter-based Gumbel-max at (seed, position), on the
device. Only the token, its log-probability and two finiteness flags are read back (one small
copy). The host draw copies the (V,) logits and filters them on the CPU instead, which cost
~9 ms a token at V = 152k with the default sampling (docs/perf-log.md, S3). The same seed
therefore draws the same tokens as the CUDA batch engine.

Greedy, or top-k sampling with top_k 1..128, without penalties or top_logprobs (the defaults and
`minfer run`'s settings): the same draw in two kernel launches instead of 27-126 torch kernels and copies
(ops/cuda/draw.py, Switches.fused_draw), its four values read back from a pinned buffer kept for
the generation. It draws the same tokens but for near-ties within rounding (its docstring).

One step ahead: with `feed` (the engine's: launch the decode step of a device token) and
`ahead=True`, the next step is launched from the sampled token *before* the host reads it, so
the GPU computes token i+1 while the host turns token i into text, checks stop strings and hands
it to the caller. Its logits wait in `pending` for the engine's next step() call; when the
generation ends there instead (end of turn, a stop string, the caller stops), that step was
speculative: the engine never added its token to `tokens`, so its cache row is unreferenced.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from minfer.errors import MinferError
from minfer.runtime.batch_sampling import _row_keys, chosen_logprobs, draw_seed, sample_rows, token_logprobs
from minfer.runtime.sampling import check_finite


class DeviceDraw:
    def __init__(self, params, top_logprobs: int = 0, feed: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 fused: bool = True):
        self.params = params
        self.seed = draw_seed(params.seed)
        self.top = top_logprobs
        self.feed = feed
        self.pending = None      # the logits of the step launched ahead (None: none in flight)
        # ops/cuda/draw.FusedDraw, made on the first CUDA call it applies to (False: never; fused
        # False is Switches.fused_draw off)
        self.fused = None if fused else False
        self.host = None         # its pinned read-back buffer, reused every token
        self._off = not fused

    def _fused(self, x: torch.Tensor):
        """The two-launch draw (ops/cuda/draw.py) when it takes this request on x's device, else
        None (the torch draw below; both counted)."""
        from minfer.ops import paths

        if x.device.type != "cuda":
            return None
        if self._off:
            paths.switched_off("sampling.device.fused", "MINFER_FUSED_DRAW")
            return None
        if self.fused is None:
            from minfer.ops.cuda import draw

            why = draw.applies(self.params, self.top)
            self.fused = False if why else draw.FusedDraw(self.params, x.device)
            if not why:
                self.host = torch.empty(4, dtype=torch.float64, pin_memory=True)
        paths.count("sampling.device.fused" if self.fused else "sampling.device.torch")
        return self.fused or None

    def __call__(self, logits: torch.Tensor, history: Sequence[int], ahead: bool = False) -> tuple[int, float, list]:
        """(token, logprob, top_logprobs) chosen from logits (V,) or (1, V) on their device;
        ahead: also launch the next step from it (self.feed) before reading it back."""
        x = logits.reshape(1, -1).float()
        fused = self._fused(x)
        if fused is not None:
            return self._fused_call(fused, x, history, ahead)
        tok = sample_rows(x, [self.params], [history], [self.seed], [len(history)])
        feed = self.feed if ahead else None
        self.pending = None
        # read before a step launched ahead overwrites a graph's logits buffer (stream order)
        flags = torch.stack([torch.isnan(x).any(), torch.isposinf(x).any()]).to(torch.float64)
        if self.top > 0:
            lps, tops = token_logprobs(x, tok, [self.top])          # host lists: a sync
            t, lp, top, bad = int(tok.item()), lps[0], tops[0], flags.tolist()
            if feed is not None:
                self.pending = feed(tok)
        else:
            vals = torch.cat([tok.to(torch.float64), chosen_logprobs(x, tok).to(torch.float64), flags])
            if vals.is_cuda:
                host = torch.empty(vals.shape, dtype=torch.float64, pin_memory=True)
                host.copy_(vals, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                if feed is not None:
                    self.pending = feed(tok)       # the GPU runs the next step while this one is read
                done.synchronize()
            else:
                host = vals
                if feed is not None:
                    self.pending = feed(tok)
            t, lp, top, bad = int(host[0]), float(host[1]), [], host[2:].tolist()
        return self._checked(t, lp, top, bad)

    def _fused_call(self, fused, x: torch.Tensor, history: Sequence[int], ahead: bool) -> tuple:
        x = x[0].contiguous()            # (no penalties: draw.applies)
        a, b = _row_keys(self.seed, len(history))
        out, tok = fused(x, a, b)
        self.pending = None
        self.host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        if ahead and self.feed is not None:
            self.pending = self.feed(tok)          # the GPU runs the next step while this one is read
        done.synchronize()
        vals = self.host.tolist()
        return self._checked(int(vals[0]), vals[1], [], vals[2:])

    def _checked(self, t: int, lp: float, top: list, bad: list) -> tuple:
        if bad[0] or bad[1] or not math.isfinite(lp):
            self.pending = None
            if bad[0] or bad[1]:     # the host draw's error, word for word (sampling.check_finite)
                check_finite(torch.tensor([math.nan if bad[0] else math.inf]))
            raise MinferError("every token has logit -inf: no token can be sampled")
        return t, lp, top
