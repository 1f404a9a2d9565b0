"""One request inside the batch engine: its tokens, sampling parameters, KV blocks and status.

A Sequence's tokens are its prompt followed by what it generated. `n_computed` of them have
their keys/values in the paged cache (minfer/runtime/paged_kv.py); the rest are computed by
the next engine steps (a prefill chunk, or the one decode token). Preemption sets n_computed
back to 0 (or to the cached prefix) and the tokens are recomputed later, so a preempted
sequence continues with the same tokens it would have produced.

The shape follows nano-vllm's engine/sequence.py (ids, block table, status); the chunked
prefill bookkeeping (n_computed) and the per-sequence seed are minfer's.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"      # queued (new, or preempted and waiting to be recomputed)
    RUNNING = "running"      # holds KV blocks; prefilling or decoding
    FINISHED = "finished"    # stop, length or cancel; its blocks are freed


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: Any                      # minfer.runtime.sampling.SamplingParams
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    seq_id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)    # prompt + generated
    n_computed: int = 0              # tokens whose K/V are in the cache
    n_cached: int = 0                # prompt tokens found in the prefix cache at the last admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)   # content hash of each full block
    state_slot: int = 0              # recurrent models: its slot of the state pool (runtime/paged_state.py; 0: none)
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None  # 'stop' | 'length' | 'cancel'
    n_preempted: int = 0
    seed: int = 0                    # the draw of token i uses (seed, i): batching never shifts it
    t_arrival: float = field(default_factory=time.perf_counter)
    t_first_token: float | None = None
    t_last_token: float | None = None
    state: Any = None                # the engine's per-sequence streaming state (decoder, stop matcher)
    error: BaseException | None = None  # why it ended, when a logits processor raised

    def __post_init__(self) -> None:
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        if not self.tokens:
            self.tokens = list(self.prompt_ids)
        from minfer.runtime.batch_sampling import draw_seed

        self.seed = draw_seed(getattr(self.params, "seed", None))

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def n_pending(self) -> int:
        """Tokens still to be fed through the model before the next token can be sampled."""
        return len(self.tokens) - self.n_computed

    @property
    def is_decoding(self) -> bool:
        return self.status is SeqStatus.RUNNING and self.n_pending == 1 and self.n_generated > 0

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, tokens={len(self.tokens)}, "
                f"computed={self.n_computed}, blocks={self.block_table})")
