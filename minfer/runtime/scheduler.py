"""Which sequences run in the next engine step, and how many of their tokens.

Each step (`schedule()`) builds one ragged batch under a token budget:
1. decode: every running sequence that has a token to feed gets one row (oldest first). When
   the pool has no block for a row, the newest running sequence not yet in this step is
   preempted (its blocks freed, its tokens recomputed later: vLLM's recompute preemption,
   nano-vllm's scheduler.py), or the sequence itself when it is the newest;
2. prefill chunks of running sequences whose prompt is not yet in the cache (a long prompt is
   split over several steps, so decoding never stalls behind it);
3. admission: waiting sequences, first come first served, while slots (`max_seqs`), the
   budget and free blocks allow. A sequence's cached prefix (block_manager.py) is attached
   on admission and not recomputed.
A step that would otherwise be empty while sequences run (all blocked on blocks) preempts the
newest, so the engine always makes progress. Finished and cancelled sequences free their
blocks at once (`finish`).

Recurrent models (`states`: the paged cache's state pool, runtime/paged_state.py): an admitted
sequence takes a zeroed state slot; finishing or preemption gives it back (a preempted sequence
is recomputed from position 0 into a fresh slot).

`decode_only_next` predicts, without changing anything, whether the next step would be a given
set of decode rows alone (the held batch engine chains such a step before it reads the
previous one: batch_engine.py `_chain`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from minfer.errors import MinferError
from minfer.runtime.block_manager import BlockManager
from minfer.runtime.sequence import Sequence, SeqStatus


@dataclass
class StepItem:
    seq: Sequence
    start: int      # position of the first token fed this step (== seq.n_computed)
    n: int          # tokens fed this step
    sample: bool    # this chunk reaches the sequence's last token: sample the next one
    is_decode: bool = False   # one token of a sequence that has generated (a decode row)


@dataclass
class ScheduledStep:
    items: list[StepItem]      # decode rows first, then prefill chunks
    n_decode: int = 0          # how many of them are decode rows

    @property
    def n_tokens(self) -> int:
        return sum(it.n for it in self.items)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_seqs: int, token_budget: int) -> None:
        if token_budget < max_seqs:
            raise MinferError(f"the token budget per step ({token_budget}) must be at least the number "
                              f"of sequences ({max_seqs}): every running sequence decodes each step")
        self.blocks = blocks
        self.max_seqs = max_seqs
        self.token_budget = token_budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []    # in admission order: the newest last
        self.n_preemptions = 0
        self.states = None                   # the recurrent state pool (PagedStatePool) of a recurrent model
        # benchmarks (bench/parallel.py, llama-batched-bench's phases): no decode row while a
        # sequence waits or has not had its first token, so all prompts are prefilled first and
        # then every sequence decodes in the same steps (unless nothing else can run: a prompt
        # may wait for the blocks they hold). Serving keeps decode rows first.
        self.prefill_first = False

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- ending sequences ------------------------------------------------------------------

    def finish(self, seq: Sequence, reason: str) -> None:
        """stop / length / cancel: free the blocks now."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.blocks.free(seq)
        if self.states is not None:
            self.states.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        if self.states is not None:
            self.states.release(seq)      # recomputed from position 0 into a fresh, zeroed slot
        seq.n_computed = 0
        seq.status = SeqStatus.WAITING
        seq.n_preempted += 1
        self.n_preemptions += 1
        self.waiting.appendleft(seq)   # resumes before anything newer is admitted

    # ---- the next step, predicted (batch_engine._chain) ----------------------------------------

    def decode_only_next(self, rows: list[Sequence], ending: list[Sequence], n_grow: int) -> tuple[bool, Sequence | None]:
        """Would the next schedule() -- run once `ending` (sequences whose next token is their
        last: a length end) have finished -- be only the decode rows of `rows`, n_grow of them
        taking a new block, with the pool left as growing those rows now leaves it? That is: no
        preemption, no prefill chunk, no admission, and the same blocks taken. Every other
        running sequence must be a prefill stalled for blocks (its own full).

        Returns (yes, touch). touch: the waiting sequence whose admission that schedule() tries
        and fails; its caller repeats the attempt's trace (BlockManager.touch_prefix) once
        `ending` are freed. A stalled prefill gets a chunk, and the head an admission, when one
        block is free after the head's cached prefix is attached (`_fit` gives a chunk of up to
        n_free * block_size tokens beyond the blocks a sequence holds). Ends on a stop are not
        known here; a caller that bets on none accepts that an admission they make possible
        comes one step later (as a slot a stop frees always did)."""
        bm = self.blocks
        bs = bm.block_size
        drop = bm.releases(ending)
        freed = bm.n_released(drop)
        if n_grow > bm.n_free:
            return False, None          # it preempts
        if n_grow > bm.n_fresh and freed:
            # it takes blocks the ended sequences freed; growing now would evict cached ones
            return False, None
        known = {s.seq_id for s in rows} | {s.seq_id for s in ending}
        stalled = [s for s in self.running if s.seq_id not in known]
        for s in stalled:
            if (s.n_generated > 0 and s.n_pending == 1) or s.n_computed < len(s.block_table) * bs:
                return False, None      # a decode row, or room for a chunk in its own blocks
        admit = bool(self.waiting) and len(rows) + len(stalled) < self.max_seqs
        if not admit and not stalled:
            return True, None           # nothing to admit, or no slot
        if admit and n_grow > bm.n_fresh and self.prefill_first:
            # its first admission attempt touches the head's prefix before the rows grow (and
            # evict): growing first could evict other blocks
            return False, None
        # free blocks when the stalled prefills and the head are tried: with prefill_first
        # before the decode rows are grown (then again after, with fewer), else after; growing
        # may evict cached blocks (the same ones now as then: no block is freed before)
        free = bm.n_free + freed - (0 if self.prefill_first else n_grow)
        if free <= 0:
            return True, None           # no free block, so no cached one either: the attempt changes nothing
        if stalled or not admit:
            return False, None          # a stalled prefill gets a chunk
        head = self.waiting[0]
        if bm.prefix_cost(head, drop, free, bm.evictions(n_grow)) < free:
            return False, None          # admitted
        return True, head

    # ---- one step ----------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = self._schedule()
        if not step.items and self.running and self.prefill_first:
            # the held decode rows are all that can run (a prompt waits for blocks they hold):
            # run them; preempting the prompt instead re-admitted it into the same wait forever
            step = self._schedule(hold=False)
        while not step.items and self.running:
            self.preempt(self.running[-1])   # everything blocked: free the newest and retry
            step = self._schedule()
        return step

    def _schedule(self, hold: bool = True) -> ScheduledStep:
        budget = self.token_budget
        decode: list[StepItem] = []
        prefill: list[StepItem] = []
        scheduled: set[int] = set()
        bm = self.blocks
        n_pre0 = self.n_preemptions

        # 1. decode rows (the oldest first: preemption takes the newest)
        bs = bm.block_size
        hold = hold and self.prefill_first and (bool(self.waiting) or any(s.n_generated == 0 for s in self.running))
        for seq in ([] if hold else list(self.running)):
            n_tok = len(seq.tokens)
            if (seq.status is not SeqStatus.RUNNING or n_tok - seq.n_computed != 1
                    or n_tok == len(seq.prompt_ids)):
                continue
            ok = True
            if seq.n_computed < len(seq.block_table) * bs:      # room in its last block: the common case
                decode.append(StepItem(seq, seq.n_computed, 1, True, True))
                scheduled.add(seq.seq_id)
                budget -= 1
                continue
            while not bm.can_grow(seq, seq.n_computed + 1):
                victim = next((s for s in reversed(self.running)
                               if s.seq_id not in scheduled and s is not seq), None)
                if victim is None or self.running.index(victim) < self.running.index(seq):
                    self.preempt(seq)            # seq is the newest unscheduled one
                    ok = False
                    break
                self.preempt(victim)
            if not ok:
                continue
            bm.grow(seq, seq.n_computed + 1)
            decode.append(StepItem(seq, seq.n_computed, 1, True, True))
            scheduled.add(seq.seq_id)
            budget -= 1

        # 2. prefill chunks of running sequences
        for seq in self.running:
            if budget <= 0:
                break
            # held: a decoding sequence's one token; a preempted one's recompute still runs (it
            # holds blocks a prompt may be waiting for)
            if seq.seq_id in scheduled or (hold and seq.n_generated > 0 and seq.n_pending == 1):
                continue
            n = self._fit(seq, min(seq.n_pending, budget))
            if n > 0:
                bm.grow(seq, seq.n_computed + n)
                prefill.append(StepItem(seq, seq.n_computed, n, n == seq.n_pending))
                scheduled.add(seq.seq_id)
                budget -= n

        # 3. admission (none in a step that preempted: the freed blocks go to the running first)
        while (self.waiting and budget > 0 and len(self.running) < self.max_seqs
               and self.n_preemptions == n_pre0):
            seq = self.waiting[0]
            cached = bm.match_prefix(seq)
            seq.n_computed = cached
            n = self._fit(seq, min(seq.n_pending, budget))
            if n == 0:
                bm.free(seq)
                seq.n_computed = 0
                break
            bm.lookups += seq.n_prompt if seq.n_preempted == 0 else 0
            bm.hits += cached if seq.n_preempted == 0 else 0
            seq.n_cached = cached
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            if self.states is not None:
                self.states.assign(seq)
            bm.grow(seq, seq.n_computed + n)
            prefill.append(StepItem(seq, seq.n_computed, n, n == seq.n_pending))
            scheduled.add(seq.seq_id)
            budget -= n
        return ScheduledStep(decode + prefill, len(decode))

    def _fit(self, seq: Sequence, want: int) -> int:
        """How many of `want` tokens the blocks seq holds plus the free ones can take."""
        bs = self.blocks.block_size
        room = (len(seq.block_table) + self.blocks.n_free) * bs - seq.n_computed
        return max(0, min(want, room))
