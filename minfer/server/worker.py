"""The generation thread of the server, and the jobs it serves.

Two workers with one interface (start, submit, stop):
- `Worker`: one request at a time over the single-user Engine (its one KV cache), FIFO;
- `BatchWorker` (`--parallel N`, N > 1): N requests at once over a BatchEngine
  (minfer/runtime/batch_engine.py): continuous batching over a paged KV cache, described below
  the Worker.

Worker: the engine has one KV cache, so one request generates at a time. Requests become Jobs in a
queue.Queue (FIFO, so served in arrival order); one daemon thread takes them one by one and
runs `engine.generate`, handing each GenEvent to the request's asyncio.Queue through
`loop.call_soon_threadsafe` -- the event loop never blocks on the model, and the model never
waits on a slow client. Between tokens the thread looks at the job's cancel flag (set when
the client goes away) and closes the generator, which frees the slot for the next job.

An embeddings job (EmbedRequest, POST /v1/embeddings) runs on the same thread, in its turn in the
queue (Worker) or between two steps of the batch (BatchWorker), through the single-user Engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("minfer.server")


@dataclass
class GenRequest:
    prompt_ids: list[int]
    params: Any  # minfer.runtime.sampling.SamplingParams
    max_new_tokens: int
    stop: list[str]
    top_logprobs: int = 0  # alternatives per token the engine should report (0: none)
    logits_processors: list = field(default_factory=list)  # e.g. a grammar mask (server/structured.py)
    skip_special: bool = False  # control tokens' text left out of the answer (skip_special_tokens)


@dataclass
class EmbedRequest:
    """An embeddings job (POST /v1/embeddings): each input's token ids, run by Engine.embed on the
    worker's thread (the one that owns the engine), between the generation jobs or the batch's steps."""

    inputs: list[list[int]]
    pooling: str
    normalize: int = 2
    dimensions: int | None = None


@dataclass
class Embedded:
    """An embeddings job's one item: the vectors, in the order of the inputs."""

    vectors: list[list[float]]


def run_embed(engine: Any, job: "Job") -> None:
    """Serve an embeddings job on the calling (worker) thread: one Embedded item, or Failed."""
    req = job.req
    try:
        job.put(Embedded(engine.embed(req.inputs, pooling=req.pooling, normalize=req.normalize,
                                      dimensions=req.dimensions)))
    except Exception as e:
        log.exception("embeddings failed")
        job.put(Failed(e))


@dataclass
class Finished:
    """The last item of every job that did not fail."""

    finish_reason: str  # 'stop' | 'length'
    n_prompt: int
    n_generated: int
    prompt_seconds: float | None  # submit of the prompt -> first token (prefill + first sample)
    decode_seconds: float | None  # first token -> last token
    cancelled: bool = False
    skipped: bool = False  # cancelled while still queued: the engine never saw it
    inter_token_seconds: list | None = None  # the gaps between consecutive tokens


class ShuttingDown(RuntimeError):
    """The error of a job the server stopped (Ctrl-C, SIGTERM): its request answers 503."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


@dataclass
class Failed:
    """The last item of a job whose generation raised."""

    error: BaseException


class Job:
    """One request's generation: written by the worker thread, read by the request's coroutine."""

    def __init__(self, req: GenRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.req = req
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Ask the worker to stop this job (or skip it if it has not started); idempotent."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def put(self, item: Any) -> None:
        """Called from the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self._cancel.set()

    async def get(self) -> Any:
        """The next GenEvent, or a Finished / Failed as the last item."""
        return await self._items.get()


class Worker:
    def __init__(self, engine: Any, on_finished: Callable[[Finished], None] | None = None,
                 on_dequeue: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self._on_finished = on_finished
        self._on_dequeue = on_dequeue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="minfer-generate", daemon=True)
        self._current: Job | None = None  # the job being generated, for stop()
        self._stopping = False            # stop() was called: a cancelled job failed, no client left

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel the waiting jobs, end the thread after the current one (which is cancelled too);
        each of them ends with Failed(ShuttingDown)."""
        self._stopping = True
        pending = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                pending.append(job)
        for job in pending:
            job.cancel()
            job.put(Failed(ShuttingDown()))
        self._current_cancel()
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _current_cancel(self) -> None:
        job = self._current
        if job is not None:
            job.cancel()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._on_dequeue:
                self._on_dequeue()
            self._current = job
            try:
                if isinstance(job.req, EmbedRequest):
                    run_embed(self.engine, job)
                    continue
                self._serve(job)
            except BaseException as e:  # never let one request kill the thread
                log.exception("generation worker: unexpected error")
                job.put(Failed(e))
            finally:
                self._current = None

    def _serve(self, job: Job) -> None:
        req = job.req
        n_prompt = len(req.prompt_ids)
        if job.cancelled:  # the client left while waiting in the queue
            self._finish(job, Finished("stop", n_prompt, 0, None, None, cancelled=True, skipped=True))
            return
        t0 = time.perf_counter()
        t_first = t_last = None
        gaps: list[float] = []   # between consecutive tokens: /metrics' inter-token histogram
        n_gen = 0
        finish = None
        cancelled = False
        extra = {"top_logprobs": req.top_logprobs} if req.top_logprobs else {}
        if req.logits_processors:
            extra["logits_processors"] = req.logits_processors
        if req.skip_special:       # (only when asked: an engine without the keyword serves the rest)
            extra["skip_special"] = True
        gen = self.engine.generate(req.prompt_ids, req.params, req.max_new_tokens, req.stop, **extra)
        try:
            for ev in gen:
                now = time.perf_counter()
                if getattr(ev, "token_id", None) is not None:
                    n_gen += 1
                    if t_first is None:
                        t_first = now
                    else:
                        gaps.append(now - t_last)
                    t_last = now
                job.put(ev)
                if getattr(ev, "finish_reason", None):
                    finish = ev.finish_reason
                    break
                if job.cancelled:
                    cancelled = True
                    break
        except Exception as e:
            log.exception("generation failed")
            self._reset_engine()
            job.put(Failed(e))
            return
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()
        if cancelled and self._stopping:   # stopped by the server, not by its client
            job.put(Failed(ShuttingDown()))
            return
        if finish is None:
            # the engine's iterator ended without a reason: count-limited, or it stopped itself
            finish = "length" if n_gen >= req.max_new_tokens else "stop"
        self._finish(job, Finished(
            finish, n_prompt, n_gen,
            prompt_seconds=(t_first - t0) if t_first is not None else None,
            decode_seconds=(t_last - t_first) if t_first is not None and n_gen > 1 else None,
            cancelled=cancelled, inter_token_seconds=gaps))

    def _finish(self, job: Job, fin: Finished) -> None:
        if self._on_finished:
            try:
                self._on_finished(fin)
            except Exception:  # metrics must never break generation
                log.exception("on_finished hook failed")
        job.put(fin)

    def _reset_engine(self) -> None:
        # a generation that raised may leave the KV cache half-written; start the next clean
        reset = getattr(self.engine, "reset", None)
        if reset is not None:
            try:
                reset()
            except Exception:
                log.exception("engine.reset() after a failed generation also failed")


class BatchWorker:
    """N requests at once: one thread drives a BatchEngine step by step.

    Between steps the thread takes every newly submitted job into the engine (a Sequence per
    job; the scheduler admits it when a slot and KV blocks allow) and passes on cancellations
    (a client that went away: the sequence's blocks are freed at the next step). Each step's
    GenEvents go to their jobs' queues; a sequence that finished ends its job with Finished.
    A step that raises fails the jobs it was serving and cancels them (their blocks freed); the
    thread keeps serving the others and new ones.
    """

    def __init__(self, engine: Any, batch_engine: Any, on_finished: Callable[[Finished], None] | None = None,
                 on_dequeue: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.batch = batch_engine
        self._on_finished = on_finished
        self._on_dequeue = on_dequeue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="minfer-batch", daemon=True)
        self._active: dict[int, tuple[Job, Any, dict]] = {}   # seq_id -> (job, seq, timing)
        self._stopping = False

    def start(self) -> "BatchWorker":
        self._thread.start()
        return self

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.put(Failed(ShuttingDown()))
        for job, _, _ in list(self._active.values()):
            job.cancel()
            job.put(Failed(ShuttingDown()))
        self._active.clear()

    def slots_info(self) -> dict:
        return self.batch.slots_info()

    # ---- the thread --------------------------------------------------------------------------

    def _take(self, block: bool) -> bool:
        """Move submitted jobs into the engine; False when asked to stop."""
        while True:
            try:
                job = self._jobs.get(timeout=0.5) if block else self._jobs.get_nowait()
            except queue.Empty:
                return not self._stopping
            block = False
            if job is None:
                return False
            if self._on_dequeue:
                self._on_dequeue()
            req = job.req
            if isinstance(req, EmbedRequest):   # the single-user engine, between two steps of the batch
                run_embed(self.engine, job)
                continue
            if job.cancelled:
                self._finish(job, Finished("stop", len(req.prompt_ids), 0, None, None, cancelled=True, skipped=True))
                continue
            try:
                skip = {"skip_special": True} if getattr(req, "skip_special", False) else {}
                seq = self.batch.add(req.prompt_ids, req.params, req.max_new_tokens, req.stop,
                                     top_logprobs=req.top_logprobs,
                                     logits_processors=getattr(req, "logits_processors", ()), **skip)
            except Exception as e:
                job.put(Failed(e))
                continue
            self._active[seq.seq_id] = (job, seq, {"t0": time.perf_counter(), "first": None, "last": None,
                                                   "n": 0, "gaps": []})

    def _run(self) -> None:
        while True:
            if not self._take(block=not self._active):
                return
            for sid, (job, seq, _) in list(self._active.items()):
                if job.cancelled:
                    self.batch.cancel(sid)
            if not self.batch.has_work:
                continue
            try:
                events = self.batch.step()
            except BaseException as e:   # never let one step kill the thread
                log.exception("batch step failed")
                self._fail_all(e)
                continue
            now = time.perf_counter()
            for seq, ev in events:
                entry = self._active.get(seq.seq_id)
                if entry is None:
                    continue
                job, _, t = entry
                if ev is None:     # cancelled, failed alone (a logits processor raised), or no tokens asked
                    del self._active[seq.seq_id]
                    if seq.error is not None:
                        job.put(Failed(seq.error))
                    elif seq.finish_reason == "cancel":
                        self._finish(job, self._finished(seq, t, "stop", cancelled=True))
                    else:
                        self._finish(job, self._finished(seq, t, seq.finish_reason or "length"))
                    continue
                t["n"] += 1
                if t["first"] is None:
                    t["first"] = now
                else:
                    t["gaps"].append(now - t["last"])
                t["last"] = now
                job.put(ev)
                if ev.finish_reason is not None:
                    del self._active[seq.seq_id]
                    self._finish(job, self._finished(seq, t, ev.finish_reason))

    def _finished(self, seq: Any, t: dict, reason: str, cancelled: bool = False) -> Finished:
        first, last = t["first"], t["last"]
        return Finished(reason, seq.n_prompt, t["n"],
                        prompt_seconds=(first - t["t0"]) if first is not None else None,
                        decode_seconds=(last - first) if first is not None and t["n"] > 1 else None,
                        cancelled=cancelled, inter_token_seconds=list(t["gaps"]))

    def _fail_all(self, e: BaseException) -> None:
        for job, _, _ in list(self._active.values()):
            job.put(Failed(e))
        self._active.clear()
        self.batch.abort_all()       # every sequence finished, every block freed

    def _finish(self, job: Job, fin: Finished) -> None:
        if self._on_finished:
            try:
                self._on_finished(fin)
            except Exception:
                log.exception("on_finished hook failed")
        job.put(fin)
