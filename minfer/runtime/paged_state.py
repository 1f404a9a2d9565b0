"""Per-sequence recurrent state for the batch engine: a pool of state slots beside the paged KV cache.

A config with `state_layers` (runtime/kv_cache.py: granitehybrid, nemotron_h, falcon-h1's Mamba-2
layers, qwen35, qwen35moe, qwen3next's gated DeltaNet layers: per layer None or the shapes of the
float32 tensors one sequence keeps, whatever its length) gets, in the PagedKVCache, one tensor per
such shape with a leading slot dimension:

    layers[l] = (conv (S, K, conv_dim), ssm (S, 2, H, P, N))      S = max_seqs + 1 slots
                (deltanet: conv (S, K, conv_dim), ssm (S, 2, Hv, Dk, Dv))

Slot 0 is the padding slot (as block 0 is the padding block): a CUDA graph bucket's padding rows
read and write it, and its contents mean nothing. A sequence takes a slot when the scheduler
admits it (`assign`: the slot's tensors are zeroed in stream order, the state before position 0)
and gives it back when it finishes, is cancelled or is preempted (`release`); a preempted
sequence is recomputed from position 0 into a fresh, zeroed slot. `Sequence.state_slot` names it
and PagedStep carries it: `state_slots` (n_decode,) on the device for the decode rows (a graph's
static tensor), `chunk_state_slots` one int per prefill chunk.

The model asks `cache.recurrent_state(layer)` (the Cache protocol's optional method) and gets a
BatchState: the layer's pools and the step's slots; models/mamba2.py conv_scan_batch (and
models/deltanet.py's, the same way) runs the decode rows in batched ops (gather by slot, one
recurrence step, scatter back) and each chunk on its slot's rings.

Prefix sharing of KV blocks (block_manager.py) cannot restore a recurrent state (the state after a
shared prefix is not kept), so the batch engine turns the prefix cache off for these models.

Memory: state_bytes(cfg) per slot (kv_cache.py's number, which the preflight also counts), times
max_seqs + 1; it does not grow with the context. On CUDA the engine sizes the slots before the KV
pool (plan_state_slots).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from minfer.errors import MinferError
from minfer.runtime.kv_cache import state_bytes

STATE_MEMORY_FRACTION = 0.5     # of the memory the KV pool would get: the most the default slots' states take


@dataclass
class BatchState:
    """A recurrent layer's view of one ragged step (what PagedKVCache.recurrent_state returns)."""

    conv: torch.Tensor             # (S, K, conv_dim) float32: every slot's conv ring
    ssm: torch.Tensor              # (S, 2, H, P, N) float32: every slot's SSM state ring (deltanet: (S, 2, Hv, Dk, Dv))
    n_decode: int                  # decode rows: tokens [0, n_decode)
    decode_slots: torch.Tensor     # (n_decode,) int64 on the device
    chunks: list                   # [(q_start, n, slot)] of the prefill chunks


class PagedStatePool:
    def __init__(self, layers: tuple, n_slots: int, device="cpu") -> None:
        """layers: per layer None or a tuple of state shapes (kv_cache.state_layers); n_slots
        including the padding slot 0."""
        if n_slots < 2:
            raise MinferError(f"the recurrent state pool needs at least 2 slots (1 is padding), got {n_slots}")
        self.n_slots = n_slots
        self.layers = [None if g is None else tuple(torch.zeros((n_slots, *s), device=device, dtype=torch.float32)
                                                    for s in g) for g in layers]
        self._free: deque[int] = deque(range(1, n_slots))

    def nbytes(self) -> int:
        return sum(t.numel() * 4 for g in self.layers if g is not None for t in g)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def assign(self, seq) -> int:
        """Give seq a free slot, zeroed (its state before position 0)."""
        if getattr(seq, "state_slot", 0):
            raise MinferError(f"sequence {seq.seq_id} already holds state slot {seq.state_slot}")
        if not self._free:
            raise MinferError("no free recurrent state slot (the scheduler admits at most max_seqs sequences)")
        slot = self._free.popleft()
        self.zero(slot)
        seq.state_slot = slot
        return slot

    def zero(self, slot: int) -> None:
        for g in self.layers:
            if g is not None:
                for t in g:
                    t[slot].zero_()

    def release(self, seq) -> None:
        """seq's slot back to the pool (finish, cancel, preemption); nothing when it holds none."""
        slot = getattr(seq, "state_slot", 0)
        if slot:
            self._free.append(slot)
            seq.state_slot = 0

    def view(self, layer: int, step) -> BatchState:
        g = self.layers[layer]
        if g is None:
            raise MinferError(f"PagedKVCache: layer {layer} keeps no recurrent state (the config has no state_layers entry)")
        conv, ssm = g
        chunks = [(q0, n, slot) for (q0, n, _, _), slot in zip(step.chunks, step.chunk_state_slots)]
        return BatchState(conv, ssm, step.n_decode, step.state_slots, chunks)


def plan_state_slots(free: int, per_slot: int, max_seqs: int | None, default_max: int) -> tuple[int, int]:
    """(max_seqs, bytes left for the KV pool) on CUDA: with max_seqs None, as many sequences as
    STATE_MEMORY_FRACTION of `free` holds states for (at most default_max, at least 1); the states
    of max_seqs + 1 slots are taken from `free`. A pure function (tested on the CPU)."""
    if max_seqs is None:
        max_seqs = max(1, min(default_max, int(free * STATE_MEMORY_FRACTION) // per_slot - 1))
    return max_seqs, max(free - (max_seqs + 1) * per_slot, 0)


def pool_state_bytes(cfg, max_seqs: int) -> int:
    """The state pool of a batch engine of max_seqs sequences: state_bytes(cfg) for each of
    max_seqs + 1 slots (0 without state_layers)."""
    return (int(max_seqs) + 1) * state_bytes(cfg)
