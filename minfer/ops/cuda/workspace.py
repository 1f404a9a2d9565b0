"""An engine's CUDA workspace: the prefill scratch, the prefetch runner (side stream, two group
buffers, the learned call sequence) and the converted-bias cache.

One Workspace per Engine, built at load from what the model declares about its weights
(`Workspace.for_model`): every matrix once, the groups it passes to ops.linear_many together
(q/k/v), and its head matrices (token embedding, lm head: gathered by row or multiplied for the
last row only in a prefill, so they do not size the single scratch). Nothing here is shared
between engines, so two engines in one process keep their own plans and buffers. The kernels
(qmatmul.py) receive it in the ops context and only choose between GEMV and dequant + GEMM.

Sizes (docs/perf-log.md section 10): the single scratch is sized by the largest layer weight
(130 MiB for the 7B) and capped by Switches.scratch_mb; the two group buffers by the largest
planned group that fits Switches.group_scratch_mb (the lm head does not, and goes in row chunks).
"""

from __future__ import annotations

import torch

from minfer.ops.cuda.prefetch import Runner


def _esize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class Workspace:
    def __init__(self, device, weights=(), groups=(), head=()):
        """weights: every matrix of the model (QWeights); groups: tuples of them that
        linear_many fuses (one scratch, one GEMM); head: matrices that do not size the single
        scratch (embedding, lm head)."""
        self.device = torch.device(device)
        self.groups = {tuple(g) for g in groups}
        head = set(head)                          # weights hash by identity (QWeight eq=False)
        layer = [w for w in weights if w not in head]
        self.largest_layer = max((w.shape[0] * w.shape[1] for w in layer), default=0)
        grouped = {w for g in self.groups for w in g}
        self.planned_sizes = ([w.shape[0] * w.shape[1] for w in weights if w not in grouped]
                              + [sum(w.shape[0] * w.shape[1] for w in g) for g in self.groups])
        self._scratch: dict = {}     # dtype -> 1-D tensor, reused by every layer
        self._runners: dict = {}     # dtype -> Runner (two buffers, side stream, sequence)
        self._bias: dict = {}        # (weights, dtype) -> (the source biases, converted/concatenated)
        self._gemv = None            # gemv_repack.GemvWorkspace: split-K ticket counters, made once
        self._bar = None             # the decode attention's grid-merge barrier (attn_barrier)
        self.raw_prenorm = frozenset()   # the norms left to raw one-pass group GEMVs (gemv.raw_prenorm_roles; at load)

    @classmethod
    def for_model(cls, model) -> "Workspace":
        """From the model's declarations (minfer.models.base.Model: qweights, linear_groups,
        head_weights)."""
        return cls(model.device, model.qweights(), model.linear_groups(), model.head_weights())

    # ---- plan ---------------------------------------------------------------------------------

    @staticmethod
    def scratch_limit_elems(dtype, sw) -> int:
        return max(1 << 20, sw.scratch_mb * (1 << 20) // _esize(dtype))

    @staticmethod
    def buffer_limit_elems(dtype, sw) -> int:
        """One group buffer's cap (default 288 MiB: the 7B's gate+up, 37888 x 3584 bf16 = 259 MiB,
        fitted when they were one group; the lm head does not and is chunked)."""
        return max(1 << 20, sw.group_scratch_mb * (1 << 20) // _esize(dtype))

    def planned_group_elems(self, dtype, sw) -> int:
        """The largest declared group, or weight alone, that fits one buffer."""
        limit = self.buffer_limit_elems(dtype, sw)
        fit = [s for s in self.planned_sizes if s <= limit]
        return max(fit) if fit else 0

    @staticmethod
    def runner_on(sw) -> bool:
        return sw.prefetch or sw.fuse_groups

    def planned_scratch_bytes(self, dtype, sw) -> int:
        """Bytes the prefill scratch takes with these switches: two group buffers when prefetch
        or groups are on, else one scratch."""
        if self.runner_on(sw):
            return 2 * self.planned_group_elems(dtype, sw) * _esize(dtype)
        return min(self.largest_layer, self.scratch_limit_elems(dtype, sw)) * _esize(dtype)

    def plan_text(self, dtype, sw) -> str:
        """The scratch plan in words, for the load line."""
        es = _esize(dtype)
        name = str(dtype).removeprefix("torch.")
        if self.runner_on(sw):
            g = self.planned_group_elems(dtype, sw) * es
            single = min(self.largest_layer, self.scratch_limit_elems(dtype, sw)) * es
            return (f"prefill scratch 2 x {g / 2**20:.0f} MiB ({name}, largest weight group; "
                    f"prefetch {'on' if sw.prefetch else 'off'}, groups {'on' if sw.fuse_groups else 'off'}) "
                    f"+ {single / 2**20:.0f} MiB when a prompt of <= {sw.prefill_graph_max} tokens is "
                    f"first graphed")
        return f"prefill scratch {self.planned_scratch_bytes(dtype, sw) / 2**20:.0f} MiB ({name})"

    def nbytes(self) -> int:
        """Bytes of scratch allocated now."""
        return (sum(t.numel() * t.element_size() for t in self._scratch.values())
                + sum(r.nbytes() for r in self._runners.values()))

    # ---- buffers ------------------------------------------------------------------------------

    def scratch(self, n_elems: int, dtype, sw) -> torch.Tensor:
        """The single scratch (1-D, at least n_elems), grown on demand."""
        buf = self._scratch.get(dtype)
        if buf is None or buf.numel() < n_elems:
            want = max(n_elems, min(self.largest_layer, self.scratch_limit_elems(dtype, sw)))
            self._scratch.pop(dtype, None)
            buf = self._scratch[dtype] = torch.empty(want, dtype=dtype, device=self.device)
        return buf

    def gemv_counters(self):
        """The repacked decode GEMV's split-K ticket counters (self-resetting, so CUDA-graph
        replays reuse them; ops/cuda/gemv_repack.py)."""
        if self._gemv is None:
            from minfer.ops.cuda.gemv_repack import GemvWorkspace

            self._gemv = GemvWorkspace(self.device)
        return self._gemv

    def attn_barrier(self) -> torch.Tensor:
        """The decode attention's grid-merge barrier: two int32 words, zero arrivals between
        launches (self-resetting, so CUDA-graph replays reuse it; ops/cuda/decode_merge.py). One
        for every layer: each layer's attention grid completes before the next one's starts."""
        if self._bar is None:
            self._bar = torch.zeros(2, dtype=torch.int32, device=self.device)
        return self._bar

    def runner(self, dtype, sw) -> Runner:
        r = self._runners.get(dtype)
        if r is None:
            r = self._runners[dtype] = Runner(self.device, dtype, self.planned_group_elems(dtype, sw),
                                              self.buffer_limit_elems(dtype, sw))
        return r

    def group_bias(self, ws, biases, dtype):
        """The group's biases concatenated in `dtype` ((sum N_i,), zeros where a weight has none),
        or None when no weight has one. Cached per group: a model's biases never change (the
        stored sources are compared by identity, so a replaced bias is converted again)."""
        if all(b is None for b in biases):
            return None
        key = (tuple(ws), dtype)
        hit = self._bias.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], biases)):
            return hit[1]
        parts = [torch.zeros(w.shape[0], dtype=dtype, device=self.device) if b is None
                 else b.to(self.device, dtype) for w, b in zip(ws, biases)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        self._bias[key] = (tuple(biases), out)
        return out

    def close(self) -> None:
        """Free the buffers (waits for the streams that may still use them)."""
        if self.device.type == "cuda" and (self._runners or self._scratch):
            torch.cuda.synchronize(self.device)
        self._runners.clear()
        self._scratch.clear()
        self._bias.clear()
