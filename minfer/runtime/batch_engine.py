"""The many-sequence engine loop: schedule -> one ragged forward -> per-row sampling -> events.

    be = BatchEngine.from_engine(Engine.load("qwen2.5-coder-0.5b-instruct"), max_seqs=8)
    a = be.add(ids_a, SamplingParams(temperature=0), max_new_tokens=32)
    b = be.add(ids_b, SamplingParams(seed=1), max_new_tokens=32)
    while be.has_work:
        for seq, ev in be.step():          # GenEvents as generate() yields them, per sequence
            ...

Each `step()`:
1. applies the cancellations asked for since the last step (their blocks are freed at once);
2. asks the Scheduler for a ragged batch (decode rows first, then prefill chunks, under a
   token budget) and describes it for the paged cache (PagedStep: positions, slots, block
   tables);
3. runs the model's one forward over all of the batch's tokens (`model.forward(tokens, step,
   cache, ctx)`, the paged cache behind the Cache protocol). On CUDA a decode-only batch
   replays a CUDA graph captured for its size bucket (batch_graphs.py);
4. samples every row that reached its last token (batch_sampling.py: per-row parameters and
   seeds) and turns each token into a GenEvent (streamed text, stop strings, end of turn),
   finishing sequences on stop or length.

Asynchronous steps (CUDA, Switches.batch_async): a decode-only step whose rows need nothing
from the host to sample (no logits processor, no penalty, no top log-probabilities) samples on
the device and is held in flight; the next step() launches the step after it from those tokens
on the device (same sequences, positions + 1, blocks grown ahead) *before* it reads the held
step's tokens and makes their events, so the host's per-step work overlaps the GPU's. Events
come one step() later. A sequence that ends on a stop while its next row already ran loses
that row (its keys/values went to a block it held; the blocks are freed after, in stream
order). Any step that needs the host (an admission, a cancel, a prefill chunk, a row that
needs a block the pool lacks) runs after the held step is read, as before. A waiting request
does not stop the chain by itself: the scheduler predicts whether the synchronous step would
admit it (Scheduler.decode_only_next: a free slot and a free block once the held step's
length ends free theirs and its cached prefix is attached), so under KV-memory pressure the
engine keeps chaining while requests wait for blocks, with the synchronous engine's batches.

The single-user `Engine` (engine.py) keeps its own contiguous cache and graphs; a BatchEngine
made from it shares its weights, tokenizer and ops context.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence as Seq

import torch

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.runtime.batch_sampling import chosen_logprobs, sample_rows, token_logprobs
from minfer.runtime.block_manager import BlockManager
from minfer.runtime.dense_planes import attach_dense_planes, detach_dense_planes
from minfer.runtime.generate import GenEvent, StopMatcher
from minfer.runtime.kv_cache import state_bytes
from minfer.runtime.paged_kv import PagedKVCache, PagedStep
from minfer.runtime.paged_state import plan_state_slots
from minfer.runtime.sampling import make_generator
from minfer.runtime.scheduler import Scheduler, StepItem
from minfer.runtime.sequence import Sequence, SeqStatus

BLOCK_SIZE = 16                       # positions per KV block (vLLM's default page size)
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUDGET = {"cpu": 512, "cuda": 4096}   # tokens per step (engine.PREFILL_CHUNK's reasoning)
DEFAULT_SLOTS = {"cpu": 4, "cuda": 256}
KV_MEMORY_FRACTION = 0.85             # of the GPU memory free after loading, when --kv-memory is not given
# the least memory a default pool grown to one full context leaves beside it, for the steps'
# transients (an estimate, not a measurement: the 7B's 4,096-token prefill chunk holds about
# 0.5 GB of FFN activations in bf16 -- 4,096 x 18,944 x 2 B x 3 -- and a few slots' logits little)
KV_RESERVE_MIN = 1 << 30


@dataclass
class _Stream:
    """Per-sequence text state: the tokenizer's stream decoder and the stop-string matcher."""

    decoder: object
    matcher: StopMatcher
    processors: list       # logits processors (runtime/generate.py LogitsProcessor), e.g. a grammar
    ignore_eos: bool = False   # benchmarks: generate exactly max_new_tokens
    logits: list = field(default_factory=list)   # with BatchEngine.keep_logits (tests)
    generator: torch.Generator | None = None      # CPU, temperature > 0: the draws (batch_sampling.py)


@dataclass
class _Launched:
    """A step whose forward is enqueued. Held (toks set): its rows were sampled on the device
    and are read by the next step(); else `logits` are sampled on the host side at once."""

    seqs: list                  # the sampled rows' sequences, in logits row order
    logits: torch.Tensor        # (R, V) of those rows (a graph's buffer: valid until the next replay)
    draw_pos: list              # index of the token each row draws (its seed's counter)
    toks: torch.Tensor | None = None    # held: (R,) sampled on the device
    lps: torch.Tensor | None = None     # held: (R,) their log-probabilities
    kept: torch.Tensor | None = None    # held with keep_logits: (R, V) float32 copy
    host: tuple | None = None           # CUDA: (tokens, log-probs) pinned host copies, and the event after them


class BatchEngine:
    # held steps when the constructor is not told: None = on CUDA (unless MINFER_BATCH_ASYNC=0), off
    # on the CPU; tests set True to run the server's CUDA logic on the CPU
    async_default: bool | None = None

    def __init__(self, model, tokenizer=None, *, n_ctx: int, max_seqs: int, n_blocks: int,
                 block_size: int = BLOCK_SIZE, token_budget: int | None = None, prefix_cache: bool = True,
                 ctx=None, cuda_graphs: bool = True, dense_planes: bool | None = None,
                 async_steps: bool | None = None) -> None:
        self.model = model
        self.config = model.cfg
        self.tokenizer = tokenizer
        self.device = model.device
        self.n_ctx = int(n_ctx)
        self.ctx = ctx
        dev = self.device.type
        self.max_seqs = int(max_seqs)
        budget = max(int(token_budget or TOKEN_BUDGET.get(dev, 512)), self.max_seqs)
        self.cache = PagedKVCache.for_config(self.config, n_blocks, block_size, self.device,
                                             dtype=getattr(model, "act_dtype", torch.float32), n_seqs=self.max_seqs)
        self.cache.context = self.n_ctx   # the cache protocol's context (phi3 picks its rope factors by it)
        # recurrent state (runtime/paged_state.py): a shared prefix's blocks cannot restore it, so no prefix cache
        self.blocks = BlockManager(n_blocks, block_size, prefix_cache and self.cache.states is None)
        self.scheduler = Scheduler(self.blocks, self.max_seqs, budget)
        self.scheduler.states = self.cache.states
        self.max_blocks = -(-self.n_ctx // block_size)   # block-table width of a full context
        self._eog = set(tokenizer.eog_ids) if tokenizer is not None else set()
        self._cancel: set[int] = set()
        self._lock = threading.Lock()
        self._seqs: dict[int, Sequence] = {}
        self.graphs = None
        if dev == "cuda":
            from minfer.ops.cuda.paged_attention import paged_decode_attention

            sw = getattr(ctx, "switches", None)
            if (sw is None or sw.decode_attention) and self.cache.v_is_view():
                # V in K (deepseek2's latent cache): the paged MLA kernel (ops/cuda/paged_attention_mla.py)
                from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

                self.cache.decode_attention = paged_mla_decode if sw is None else functools.partial(
                    paged_mla_decode, programs=sw.paged_attn_programs)
            elif sw is None or sw.decode_attention:
                self.cache.decode_attention = paged_decode_attention
                if sw is not None:
                    self.cache.decode_attention = functools.partial(paged_decode_attention,
                                                                    target_programs=sw.paged_attn_programs,
                                                                    merge_in_kernel=sw.paged_attn_merge)
                    if not sw.paged_attn_merge:
                        paths.switched_off("attention.paged_decode.merge_in_kernel", "MINFER_PAGED_ATTN_MERGE")
            else:
                paths.switched_off("attention.paged_decode.triton", "MINFER_DECODE_ATTN")
            if cuda_graphs and sw is not None and not sw.cuda_graph:
                paths.switched_off("graph.batch_decode.replay", "MINFER_CUDA_GRAPH")
            elif cuda_graphs:
                from minfer.runtime.batch_graphs import BatchDecodeGraphs

                self.graphs = BatchDecodeGraphs(self, [b for b in GRAPH_BUCKETS if b <= _bucket(self.max_seqs)])
        self.keep_logits = False    # tests: each sampled row's logits kept in seq.state.logits (host)
        sw = getattr(ctx, "switches", None)
        # held decode steps (module docstring); default: on CUDA unless MINFER_BATCH_ASYNC=0. The
        # CPU gains nothing (its forward is synchronous) but tests run the same logic there.
        if async_steps is None:
            async_steps = self.async_default
        self.async_steps = (dev == "cuda" and (sw is None or sw.batch_async)) if async_steps is None else async_steps
        if dev == "cuda" and not self.async_steps and async_steps is None:
            paths.switched_off("batch.async_step", "MINFER_BATCH_ASYNC")
        self._inflight: _Launched | None = None
        self.dense_plane_bytes = 0
        if dev == "cuda" and dense_planes is not False:
            self.dense_plane_bytes = attach_dense_planes(model, force=bool(dense_planes),
                                                         switches=getattr(ctx, "switches", None))
        elif dev == "cuda":
            detach_dense_planes(model)
            paths.switched_off("qmatmul.dense_plane", "dense_planes=False")
        if dev == "cuda" and getattr(ctx, "workspace", None) is not None:
            from minfer.ops.cuda.gemv import raw_prenorm_roles

            ctx.workspace.raw_prenorm = raw_prenorm_roles(model)   # (dense planes take the raw groups' rows)
        # held_steps: sampled on the device and held; chained_steps: launched from a held step's tokens
        self.stats = {"steps": 0, "decode_rows": 0, "prefill_tokens": 0, "graph_steps": 0,
                      "held_steps": 0, "chained_steps": 0}

    @classmethod
    def from_engine(cls, engine, max_seqs: int | None = None, kv_memory: int | None = None,
                    **kw) -> "BatchEngine":
        """A batch engine over a loaded Engine's model.

        kv_memory: bytes for the paged cache; default on CUDA KV_MEMORY_FRACTION of the free
        memory, at least one full context (MinferError when the memory cannot hold it) and at
        most what max_seqs full contexts need; on the CPU max_seqs full contexts (plan_pool).
        max_seqs: default on CUDA as many sequences as the cache holds at a quarter of the
        context each (at most 256: longer ones are preempted when memory runs out), on the CPU
        DEFAULT_SLOTS."""
        model = engine.model
        if not getattr(model, "causal", True):
            raise MinferError(f"architecture '{model.arch}' cannot run in the batch engine: it is an encoder (embeddings "
                              "only, no KV cache, nothing to generate); serve it one request at a time (minfer serve "
                              "-np 1)")
        if not getattr(model, "paged_kv", True):
            raise MinferError(f"architecture '{model.arch}' cannot run in the batch engine: its paged KV cache "
                              "does not apply this model's attention (e.g. deepseek2's latent K/V); serve it one "
                              "request at a time (minfer serve -np 1)")
        dev = model.device.type
        bs = kw.pop("block_size", BLOCK_SIZE)
        if dev == "cuda" and kw.get("dense_planes") is not False:
            attach_dense_planes(model, force=bool(kw.get("dense_planes")),   # before the free memory is read
                                switches=getattr(getattr(engine, "ctx", None), "switches", None))
        per_block = PagedKVCache.bytes_per_block(model.cfg, bs, getattr(model, "act_dtype", torch.float32))
        free = None
        if dev == "cuda" and (kv_memory is None or max_seqs is None):
            free, _ = torch.cuda.mem_get_info(model.device)
            if state_bytes(model.cfg):       # the state slots first (runtime/paged_state.py)
                max_seqs, free = plan_state_slots(free, state_bytes(model.cfg), max_seqs, DEFAULT_SLOTS["cuda"])
        slots, n_blocks = plan_pool(engine.n_ctx, bs, per_block, max_seqs, kv_memory, free,
                                    DEFAULT_SLOTS.get(dev, 4), str(model.device))
        return cls(model, engine.tokenizer, n_ctx=engine.n_ctx, max_seqs=slots, n_blocks=n_blocks,
                   block_size=bs, ctx=getattr(engine, "ctx", None), **kw)

    # ---- requests ---------------------------------------------------------------------------

    def add(self, prompt_ids: Seq[int], params, max_new_tokens: int | None = None, stop: Iterable[str] = (),
            top_logprobs: int = 0, logits_processors: Seq = (), ignore_eos: bool = False,
            skip_special: bool = False) -> Sequence:
        """Queue a request; returns its Sequence (its seq_id names it in events and cancel()).
        logits_processors change that row's logits before its sampling (not its logprobs);
        skip_special leaves control tokens' text out of the events' text (Engine.generate)."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise MinferError("the prompt is empty: at least one token is needed")
        bad = [t for t in ids if not 0 <= t < self.config.vocab]
        if bad:
            raise MinferError(f"token id {bad[0]} is outside the vocabulary of {self.config.vocab}")
        limit = min(self.n_ctx, self.blocks.capacity_tokens)
        if len(ids) > limit:
            raise MinferError(f"the prompt has {len(ids)} tokens but a sequence holds at most {limit} "
                              f"(context {self.n_ctx}, KV cache {self.blocks.capacity_tokens} positions); "
                              "use a larger --ctx/--kv-memory or a shorter prompt")
        room = limit - len(ids) + 1       # the last new token is never fed back
        n_new = room if max_new_tokens is None else max(0, min(int(max_new_tokens), room))
        stop = [s for s in stop if s]
        if stop and self.tokenizer is None:
            raise MinferError("stop strings need a tokenizer, and this engine has none")
        seq = Sequence(ids, params, n_new, stop, top_logprobs)
        dec = None if self.tokenizer is None else \
            self.tokenizer.stream_decoder(True) if skip_special else self.tokenizer.stream_decoder()
        seq.state = _Stream(dec, StopMatcher(stop), list(logits_processors), ignore_eos)
        if self.device.type == "cpu" and not params.greedy:
            # seeded as generate.generate seeds the single engine's, so the same seed draws the
            # same tokens (batch_sampling.py); no seed: the sequence's own random one
            seq.state.generator = make_generator(seq.seed if params.seed is None else params.seed)
        with self._lock:
            self._seqs[seq.seq_id] = seq
            self.scheduler.add(seq)
        return seq

    def cancel(self, seq_id: int) -> None:
        """Stop a sequence (any thread); its blocks are freed at the start of the next step."""
        with self._lock:
            self._cancel.add(seq_id)

    def abort_all(self) -> None:
        """Finish every sequence now ('cancel'), freeing all blocks (after a step that raised)."""
        with self._lock:
            for seq in list(self._seqs.values()):
                if not seq.finished:
                    self.scheduler.finish(seq, "cancel")
            self._seqs.clear()
            self._cancel.clear()
            self._inflight = None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._cancel) or self._inflight is not None

    # ---- the loop ------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[tuple[Sequence, GenEvent | None]]:
        """One engine step. Returns (sequence, event) pairs: a GenEvent per sampled token (its
        finish_reason set on the last), and (sequence, None) for a sequence that ended without
        a token now: cancelled (finish_reason 'cancel'), failed (seq.error), or asked for none
        ('length'). With held steps (module docstring) a step's events come one call later."""
        out: list[tuple[Sequence, GenEvent | None]] = []
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            for sid in cancel:
                seq = self._seqs.pop(sid, None)
                if seq is not None and not seq.finished:
                    self.scheduler.finish(seq, "cancel")
                    out.append((seq, None))
            for seq in [s for s in self._seqs.values() if s.max_new_tokens == 0 and s.status is SeqStatus.WAITING]:
                self.scheduler.finish(seq, "length")    # nothing to generate
                self._seqs.pop(seq.seq_id, None)
                out.append((seq, None))
        held, self._inflight = self._inflight, None
        nxt, touch = self._chain(held) if held is not None and not cancel else (None, None)
        if held is not None:
            out += self._finish(held)          # waits for the held step; the chained one runs meanwhile
        if touch is not None:
            with self._lock:                   # the failed admission the synchronous step makes
                if self.scheduler.waiting and self.scheduler.waiting[0] is touch:
                    self.blocks.touch_prefix(touch)
        if nxt is None:
            with self._lock:
                sched = self.scheduler.schedule()
            if sched.items:
                items = sched.items
                tokens = [t for it in items for t in it.seq.tokens[it.start:it.start + it.n]]
                ran = self._launch(items, tokens, sched.n_decode == len(items))
                if ran is not None and ran.toks is None:
                    out += self._finish(ran)
                else:
                    nxt = ran
        self._inflight = nxt
        return out

    def _launch(self, items: list[StepItem], tokens, decode_only: bool, chained: bool = False) -> _Launched | None:
        """Enqueue one step's forward (tokens: a host list, or a device tensor of a chained
        step) and, when every sampled row allows it, its sampling on the device (held)."""
        logits = None
        if decode_only and self.graphs is not None:
            logits = self.graphs.run(items, tokens)
            if logits is not None:
                self.stats["graph_steps"] += 1
        if logits is None:
            pstep = PagedStep.build(items, self.cache.block_size, self.device, states=self.cache.states is not None)
            tt = tokens if torch.is_tensor(tokens) else torch.tensor(tokens, dtype=torch.long, device=self.device)
            logits = self._forward(tt, pstep)
        self.stats["steps"] += 1
        n_decode = sum(1 for it in items if it.is_decode)
        self.stats["decode_rows"] += n_decode
        self.stats["prefill_tokens"] += sum(it.n for it in items) - n_decode
        for it in items:
            it.seq.n_computed += it.n
            if not chained:          # a chained row's fed token is appended when the held step is read
                self.blocks.commit(it.seq)
        sampled = [it for it in items if it.sample]
        if not sampled:
            return None
        run = _Launched([it.seq for it in sampled], logits[:len(sampled)], [it.start + it.n for it in sampled])
        if decode_only and self.async_steps and all(self._device_only(s) for s in run.seqs):
            seqs = run.seqs
            run.toks = sample_rows(run.logits, [s.params for s in seqs], [s.tokens for s in seqs],
                                   [s.seed for s in seqs], run.draw_pos, self._generators(seqs))
            run.lps = chosen_logprobs(run.logits, run.toks)
            if self.keep_logits:
                run.kept = run.logits.float().clone()
            if run.toks.is_cuda:
                # read back through pinned copies and an event recorded now: a plain .tolist() at
                # _finish would also wait for the step chained after this one (stream order)
                th = torch.empty(run.toks.shape, dtype=run.toks.dtype, pin_memory=True)
                lh = torch.empty(run.lps.shape, dtype=run.lps.dtype, pin_memory=True)
                th.copy_(run.toks, non_blocking=True)
                lh.copy_(run.lps, non_blocking=True)
                kh = None
                if run.kept is not None:
                    kh = torch.empty(run.kept.shape, dtype=run.kept.dtype, pin_memory=True)
                    kh.copy_(run.kept, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
                run.host = (th, lh, kh, ev)
            paths.count("batch.async_step")
            self.stats["held_steps"] += 1
        return run

    @staticmethod
    def _device_only(seq: Sequence) -> bool:
        """Its next token needs nothing from the host: no logits processor, penalty or top log-probs."""
        p = seq.params
        return (not seq.state.processors and not seq.top_logprobs and p.repeat_penalty == 1.0
                and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0)

    def _chain(self, held: _Launched) -> tuple[_Launched | None, Sequence | None]:
        """Launch the decode step after the held one from its device tokens when the synchronous
        step would be those decode rows alone: a block for each row that crosses into a new one
        without preempting, and no prefill chunk or admission -- every other running sequence
        a prefill stalled for blocks, and no request waiting, no slot free, or no block free for
        them once the held step's length ends free theirs (Scheduler.decode_only_next).
        Returns (the chained step or None, the waiting sequence whose failed admission the
        caller repeats after reading the held step)."""
        if held.toks is None:
            return None, None
        with self._lock:
            sch = self.scheduler
            seqs = held.seqs
            if any(s.status is not SeqStatus.RUNNING for s in seqs):
                return None, None
            # rows whose held token is not their last (a length finish is known now; a stop is
            # not). The others end when it is read: their slots and blocks go to a waiting
            # request in the synchronous engine's next step, so they count as free here.
            rows = [r for r, s in enumerate(seqs) if s.n_generated + 1 < s.max_new_tokens]
            if not rows:
                return None, None
            ending = [s for s in seqs if s.n_generated + 1 >= s.max_new_tokens]
            bs = self.cache.block_size
            grow = [seqs[r] for r in rows if seqs[r].n_computed >= len(seqs[r].block_table) * bs]
            ok, touch = sch.decode_only_next([seqs[r] for r in rows], ending, len(grow))
            if not ok:
                return None, None
            for s in grow:
                self.blocks.grow(s, s.n_computed + 1)
            items = [StepItem(seqs[r], seqs[r].n_computed, 1, True, True) for r in rows]
        toks = held.toks
        if len(rows) < len(seqs):
            toks = toks.index_select(0, torch.tensor(rows, dtype=torch.long).to(toks.device, non_blocking=True))
        paths.count("batch.async_chain")
        self.stats["chained_steps"] += 1
        return self._launch(items, toks, True, chained=True), touch

    def _finish(self, run: _Launched) -> list[tuple[Sequence, GenEvent | None]]:
        if run.toks is None:
            return self._sample(run.seqs, run.logits, run.draw_pos)
        if run.host is not None:
            th, lh, kept, ev = run.host
            ev.synchronize()                    # this step only, not the chained one behind it
            toks, lps = th.tolist(), lh.tolist()
        else:
            toks, lps = run.toks.tolist(), run.lps.tolist()
            kept = run.kept.cpu() if run.kept is not None else None
        out: list[tuple[Sequence, GenEvent | None]] = []
        now = time.perf_counter()
        for r, seq in enumerate(run.seqs):
            if seq.finished:        # cancelled, or ended on a stop while this row ran: dropped
                continue
            if kept is not None:
                seq.state.logits.append(kept[r])
            out.append(self._emit(seq, toks[r], lps[r], [], now))
        return out

    def _forward(self, tokens: torch.Tensor, pstep: PagedStep) -> torch.Tensor:
        """tokens (T,) of a ragged batch -> logits (R, V) of its logit rows."""
        from minfer.models.base import Step

        self.cache.step = pstep
        return self.model.forward(tokens, Step(pstep.positions, None, pstep.logit_rows), self.cache, self.ctx)

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor, draw_pos: list[int]) -> list[tuple[Sequence, GenEvent | None]]:
        out: list[tuple[Sequence, GenEvent | None]] = []
        x = logits
        for r, seq in enumerate(seqs):
            if seq.state.processors:
                try:
                    row = logits[r]
                    for proc in seq.state.processors:
                        row = proc(seq.tokens[seq.n_prompt:], row)
                except Exception as e:      # this request fails alone (e.g. a grammar refused)
                    seq.error = e
                    self._end(seq, "cancel")
                    out.append((seq, None))
                    continue
                if x is logits:
                    x = logits.clone()
                x[r] = row.to(x.device, x.dtype)
        keep = [r for r, s in enumerate(seqs) if not s.finished]
        if len(keep) < len(seqs):
            idx = torch.tensor(keep, dtype=torch.long, device=logits.device)
            seqs, logits, x = [seqs[r] for r in keep], logits.index_select(0, idx), x.index_select(0, idx)
            draw_pos = [draw_pos[r] for r in keep]
        if not seqs:
            return out
        if self.keep_logits:
            for seq, row in zip(seqs, logits.float().cpu()):
                seq.state.logits.append(row)
        params = [s.params for s in seqs]
        failed: list = [None] * len(seqs)
        toks = sample_rows(x, params, [s.tokens for s in seqs], [s.seed for s in seqs], draw_pos,
                           self._generators(seqs), failed)
        lps, tops = token_logprobs(logits, toks, [s.top_logprobs for s in seqs])
        now = time.perf_counter()
        for seq, tok, lp, top, err in zip(seqs, toks.tolist(), lps, tops, failed):
            if err is not None:             # this request fails alone, as the single engine's would
                seq.error = err
                self._end(seq, "cancel")
                out.append((seq, None))
                continue
            out.append(self._emit(seq, tok, lp, top, now))
        return out

    def _generators(self, seqs: list[Sequence]) -> list | None:
        """Each row's torch.Generator on the CPU (None for a greedy row); None on CUDA, whose
        draw is the counter-based one (batch_sampling.py says why)."""
        return [s.state.generator for s in seqs] if self.device.type == "cpu" else None

    def _emit(self, seq: Sequence, tok: int, lp: float, top: list, now: float) -> tuple[Sequence, GenEvent]:
        """seq's new token: appended (its block hashes committed), its event made, its end applied."""
        seq.tokens.append(tok)
        self.blocks.commit(seq)     # a chained row's block may have become full with this token
        if seq.t_first_token is None:
            seq.t_first_token = now
        seq.t_last_token = now
        ev = self._event(seq, tok, lp, top)
        if ev.finish_reason is not None:
            self._end(seq, ev.finish_reason)
        return seq, ev

    def _end(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        with self._lock:
            self._seqs.pop(seq.seq_id, None)

    def _event(self, seq: Sequence, tok: int, lp: float, top: list) -> GenEvent:
        """The GenEvent of seq's new token: the same text rules as generate.generate()."""
        st = seq.state
        dec, matcher = st.decoder, st.matcher
        if tok in self._eog and not st.ignore_eos:
            text, _ = matcher.push(dec.flush() if dec is not None else "")
            return GenEvent(tok, text + matcher.flush(), lp, top, "stop")
        text, stopped = matcher.push(dec.push(tok) if dec is not None else "")
        if stopped:
            return GenEvent(tok, text, lp, top, "stop")
        if seq.n_generated >= seq.max_new_tokens:
            tail, stopped = matcher.push(dec.flush() if dec is not None else "")
            text += tail
            if stopped:
                return GenEvent(tok, text, lp, top, "stop")
            return GenEvent(tok, text + matcher.flush(), lp, top, "length")
        return GenEvent(tok, text, lp, top, None)

    # ---- conveniences ----------------------------------------------------------------------------

    def generate_many(self, prompts: Seq[Seq[int]], params, max_new_tokens: int | None = None,
                      stop: Iterable[str] = ()) -> list[list[GenEvent]]:
        """Run prompts together to the end; each prompt's GenEvents (params: one for all, or a list)."""
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        seqs = [self.add(p, pp, max_new_tokens, stop) for p, pp in zip(prompts, plist)]
        events: dict[int, list[GenEvent]] = {s.seq_id: [] for s in seqs}
        while self.has_work:
            for seq, ev in self.step():
                if ev is not None and seq.seq_id in events:
                    events[seq.seq_id].append(ev)
        return [events[s.seq_id] for s in seqs]

    def warm_graphs(self) -> int:
        """CUDA: capture the decode graph of every batch bucket up front (batch_graphs.warm);
        0 without graphs."""
        return self.graphs.warm() if self.graphs is not None else 0

    def slots_info(self) -> dict:
        bm = self.blocks
        return {"slots": self.max_seqs, "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting), "kv_blocks_total": bm.n_blocks - 1,
                "kv_blocks_used": bm.n_used, "kv_blocks_free": bm.n_free, "kv_block_size": bm.block_size,
                "prefix_hit_tokens": bm.hits, "prefix_lookup_tokens": bm.lookups,
                "preemptions": self.scheduler.n_preemptions}


def plan_pool(n_ctx: int, block_size: int, per_block: int, max_seqs: int | None = None,
              kv_memory: int | None = None, free: int | None = None, default_slots: int = 4,
              device: str = "cuda") -> tuple[int, int]:
    """(sequences, KV blocks) of BatchEngine.from_engine's pool; a pure function, so the CUDA
    sizing is tested on the CPU with chosen `free` values.

    free: bytes of device memory free after the load (CUDA, when kv_memory or max_seqs is not
    given); None: the CPU rule, `default_slots` full contexts. Without kv_memory the pool is
    KV_MEMORY_FRACTION of `free`, grown to one full context (block 0 pads block tables, so
    ceil(n_ctx / block_size) + 1 blocks) when that leaves KV_RESERVE_MIN beside it: a smaller
    pool refused every prompt past it and cut answers there. MinferError, naming the sizes,
    when not even that fits. A kv_memory given is taken as it is (`minfer serve` and `bench`
    check it against the context before the load)."""
    ctx_blocks = -(-int(n_ctx) // block_size)
    one_ctx = (ctx_blocks + 1) * per_block
    if free is not None and (kv_memory is None or max_seqs is None):
        budget = kv_memory
        if budget is None:
            budget = int(free * KV_MEMORY_FRACTION)
            if budget < one_ctx:
                if one_ctx > free - KV_RESERVE_MIN:
                    fit = max((free - KV_RESERVE_MIN) // per_block - 1, 0) * block_size
                    raise MinferError(
                        f"the paged KV cache of one full context ({n_ctx} tokens, -c/--ctx) needs "
                        f"{one_ctx / 2**20:.0f} MiB ({ctx_blocks + 1} blocks of {block_size} positions, "
                        f"{per_block / 2**20:.2f} MiB each), but {free / 2**20:.0f} MiB of {device} memory is "
                        f"free after the load, of which {KV_RESERVE_MIN / 2**20:.0f} MiB stays for the steps: "
                        f"give -c/--ctx {fit} or less, or --parallel 1 (one request at a time)")
                budget = one_ctx
        if max_seqs is None:
            # as many sequences as the pool holds at a quarter context each
            max_seqs = max(1, min(DEFAULT_SLOTS["cuda"], (budget // per_block - 1) * 4 // ctx_blocks))
        if kv_memory is None:
            kv_memory = min(budget, (max_seqs * ctx_blocks + 1) * per_block)
    slots = int(max_seqs or default_slots)
    if slots < 1:
        raise MinferError(f"--parallel {slots}: expected at least 1 sequence")
    if kv_memory is None:
        kv_memory = (slots * ctx_blocks + 1) * per_block
    n_blocks = int(kv_memory // per_block)
    if n_blocks < 2:
        raise MinferError(f"--kv-memory {kv_memory / 2**20:.1f} MiB holds {n_blocks} KV blocks of {block_size} "
                          f"positions ({per_block / 2**20:.2f} MiB each); give it more memory")
    return slots, n_blocks


def _bucket(n: int) -> int:
    for b in GRAPH_BUCKETS:
        if n <= b:
            return b
    return n
