"""The single-sequence engine's choice of the next token on CUDA (generate.generate's `draw`).

It is the batch engine's draw (runtime/batch_sampling.sample_rows) for one row: penalties,
top-k, top-p, min-p, temperature and a counter-based Gumbel-max at (seed, position), on the
device. Only the token, its log-probability and two finiteness flags are read back (one small
copy). The host draw copies the (V,) logits and filters them on the CPU instead, which cost
~9 ms a token at V = 152k with the default sampling (docs/perf-log.md, S3). The same seed
therefore draws the same tokens as the CUDA batch engine.

Greedy, or top-k sampling with top_k 1..128, without penalties or top_logprobs (the defaults and
`minfer run`'s settings): the same draw in two or three kernel launches instead of 27-126 torch kernels and copies
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
        self.fused = None        # ops/cuda/draw.FusedDraw, made on the first CUDA call it takes (False: it does not)
        self._off = not fused    # Switches.fused_draw off

    def _fused(self, x: torch.Tensor):
        """The fused draw (ops/cuda/draw.py) when it takes this request on x's device, else
        None (the torch draw below; both counted)."""
        from minfer.ops import paths

        if x.device.type != "cuda":
            return None
        if self._off:
            paths.switched_off("sampling.device.fused", "MINFER_FUSED_DRAW")
            return None
        if self.fused is None:
            from minfer.ops.cuda import draw

            self.fused = False if draw.applies(self.params, self.top) else draw.FusedDraw(self.params, x.device)
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
            host = torch.empty(vals.shape, dtype=torch.float64, pin_memory=True) if vals.is_cuda else None
            t, lp, top, bad = self._read_back(vals, host, tok, feed)
        return self._checked(t, lp, top, bad)

    def _fused_call(self, fused, x: torch.Tensor, history: Sequence[int], ahead: bool) -> tuple:
        x = x[0].contiguous()            # (no penalties: draw.applies)
        out, tok = fused(x, *_row_keys(self.seed, len(history)))
        self.pending = None
        return self._checked(*self._read_back(out, fused.host, tok, self.feed if ahead else None))

    def _read_back(self, vals: torch.Tensor, host: torch.Tensor | None, tok: torch.Tensor, feed) -> tuple:
        """(token, logprob, [], [NaN flag, +inf flag]) of vals [token, logprob, flags] (float64),
        copied into the pinned `host` (None: vals are on the CPU); feed: launch the next step from
        tok before waiting for the copy, so the GPU runs it while this one is read."""
        if host is not None:
            host.copy_(vals, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        if feed is not None:
            self.pending = feed(tok)
        if host is not None:
            done.synchronize()
            vals = host
        v = vals.tolist()
        return int(v[0]), v[1], [], v[2:]

    def _checked(self, t: int, lp: float, top: list, bad: list) -> tuple:
        if bad[0] or bad[1] or not math.isfinite(lp):
            self.pending = None
            if bad[0] or bad[1]:     # the host draw's error, word for word (sampling.check_finite)
                check_finite(torch.tensor([math.nan if bad[0] else math.inf]))
            raise MinferError("every token has logit -inf: no token can be sampled")
        return t, lp, top
