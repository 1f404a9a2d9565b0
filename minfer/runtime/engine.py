"""Engine: a loaded model, its tokenizer and KV cache; forward passes and generation.

    eng = Engine.load("qwen2.5-coder-0.5b-instruct")            # device='cpu', ctx=None
    eng.complete("The capital of France is", max_tokens=16, temperature=0)   # -> str
    eng.chat([{"role": "user", "content": "Hi"}], max_tokens=64)             # -> str
    ids = eng.tokenizer.encode("The capital of France is")
    for ev in eng.generate(ids, SamplingParams(temperature=0), max_new_tokens=16):
        print(ev.text, end="")                                  # streamed, token by token
    eng.close()                                                 # or: with minfer.load(...) as eng:

One Engine runs one call at a time: a call from a second thread while one runs, or a generate()
iterator resumed after a later call on the same Engine, is a MinferError (not a silently mixed
cache). For concurrent requests use `minfer serve --parallel N` (runtime/batch_engine.py).

The engine remembers which tokens its cache holds: generate() re-uses the longest common
prefix with the new prompt (multi-turn chat only computes the new turn). A model with recurrent
state (Model.recurrent: granitehybrid's Mamba-2 layers) holds the state after its last cached
token only, which cannot be rewound: it re-uses the cached tokens only when all of them begin
the new prompt (else it recomputes from position 0), and forward() may start at 0 or at the end
of the cached tokens only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.ops.context import Context
from minfer.runtime.generate import (GenEvent, check_count, check_params, check_prompt_ids, check_stop, generate,
                                     sampling_from_kwargs)
from minfer.runtime import compile_watch, cpu_calibration
from minfer.runtime.cpu_calibration import CPU_CALIBRATION, CPU_INT4_KL_MAX, prepare_cpu_quant  # noqa: F401 (names kept here)
from minfer.runtime.cuda_graphs import DecodeGraph, inference_scope
from minfer.runtime.embed import Embeddings, cache_note, engine_cache
from minfer.runtime.sampling import SamplingParams
from minfer.switches import Switches

DEFAULT_CTX = 4096
# Prompt tokens per forward pass (Switches.prefill_chunk overrides). On the CPU 512 bounds the
# (T, S) attention scores of a long prompt. On CUDA attention never builds a (T, S) matrix and the
# GEMMs gain from large M (ANCHORS.md: dequant + cuBLAS at M=3354 runs ~1.5x the rate at M=512),
# so a whole prompt of up to 4096 tokens goes in one pass.
PREFILL_CHUNK = {"cpu": 512, "cuda": 4096}


# Switches no captured graph reads (generate()'s draw): set_switches keeps the graphs if only these change
_OUTSIDE_GRAPHS = frozenset({"fused_draw"})


class Engine(Embeddings):
    """A model with its tokenizer, KV cache, switches and workspace.

    The engine owns everything that changes what or how it computes: `switches` (frozen,
    minfer.switches.Switches), `ctx` (the switches and the CUDA workspace the ops receive), the
    cache and the captured graphs. Two engines in one process share nothing but the kernels."""

    def __init__(self, model, tokenizer=None, n_ctx: int | None = None, path: Path | None = None,
                 switches: Switches | None = None):
        self.model = model
        self.config = model.cfg
        self.tokenizer = tokenizer
        self.device = model.device
        self.path = path
        self.n_ctx = int(n_ctx or min(self.config.context_length, DEFAULT_CTX))
        if self.n_ctx <= 0:
            raise MinferError(f"--ctx must be positive, got {self.n_ctx}")
        self.switches = switches or Switches()
        workspace = None
        if self.device.type == "cuda":
            from minfer.device import cuda_backend

            workspace = cuda_backend().Workspace.for_model(model)
            if self.switches.gemv_repack:   # Q4_K/Q6_K planes replace the raw blocks (ops/cuda/gemv_repack.py)
                from minfer.ops.cuda.gemv_repack import repack_model

                repack_model(model)
                self._plane_layout()
            from minfer.ops.cuda.gemv import fuse_raw_groups, raw_prenorm_roles

            fuse_raw_groups(model)   # groups left in raw blocks: one stacked tensor (row views), one GEMV
            workspace.raw_prenorm = raw_prenorm_roles(model)  # (Switches.gemv_raw_norm: the norms into them)
        self.ctx = Context(self.switches, workspace)
        self.cache = engine_cache(model, self.n_ctx, self.device)   # none for an encoder (runtime/embed.py)
        self.tokens: list[int] = []   # the tokens whose keys/values the cache holds, in order
        self.stats: dict = {}
        self._graph = None            # DecodeGraph (CUDA), captured at the first decode step
        self._prefill_graphs = None   # PrefillGraphs (CUDA), short prompts from position 0
        self._lock = threading.Lock()  # held while a call computes (see _busy)
        self._epoch = 0               # bumped by every call that rewrites the cache (see generate)
        self._closed = False

    @classmethod
    def load(cls, model, device: str = "cpu", ctx: int | None = None, dtype=None,
             progress: bool = True, switches: Switches | None = None) -> "Engine":
        """model: a catalog name, a path to a .gguf, or an open GGUFFile. switches: default
        Switches.from_env() (the one read of the MINFER_* behaviour variables). The lower-level
        call: minfer.load() checks its arguments, picks the device and checks ctx first."""
        from minfer.gguf_file import GGUFFile
        from minfer.models import load_model
        from minfer.models.llama import activation_dtype

        sw = switches if switches is not None else Switches.from_env()
        if switches is None:
            import sys

            from minfer.process_env import retired_in_env

            for r in retired_in_env():          # decided A/Bs: set, but no longer read
                print(f"minfer: warning: {r}; it is not read any more", file=sys.stderr)
        if sw.threads:
            from minfer.device import usable_cpus

            # MINFER_THREADS (the CLI's -t is cut the same way, commands/common.py): more threads
            # than CPUs only slow every step (MINFER_THREADS=64 on 2 CPUs: 15.4 s against 3.7 s)
            t = min(sw.threads, usable_cpus())
            if t < sw.threads:
                import sys

                print(f"minfer: warning: MINFER_THREADS={sw.threads}: this process may run on {t} CPUs; "
                      f"using {t}", file=sys.stderr)
            torch.set_num_threads(t)
        if device == "cuda":
            from minfer.device import cuda_backend

            cuda_backend()  # fail before spending time on the weights
        if isinstance(model, GGUFFile):
            gf = model
        else:
            from minfer.catalog import resolve_model

            gf = GGUFFile(resolve_model(str(model)))
        if device == "cpu":      # weights that cannot fit: one line, before any is read (runtime/cpu_memory.py)
            from minfer.runtime.cpu_memory import check_cpu_memory

            check_cpu_memory(gf, sw.cpu_quant, dtype)
        t0 = time.perf_counter()
        m = load_model(gf, device=device, dtype=dtype, progress=progress,
                       act_dtype=activation_dtype(device, sw.act_dtype))
        tok = load_tokenizer(gf)
        quant_note = None
        if device == "cpu" and sw.cpu_quant:   # int4/int8 matrices for the CPU (ops/cpu_quant.py)
            quant_note = prepare_cpu_quant(m, tok, gf.path, progress)   # (its outcome cached per file)
        elif device == "cpu":    # the float32 reference: MoE experts dense too (ops/cpu_experts.py)
            from minfer.ops.cpu_experts import densify_experts

            densify_experts(m, dtype)
        eng = cls(m, tok, ctx, gf.path, switches=sw)
        eng.cpu_quant_report = quant_note
        if quant_note and quant_note.get("refused") and progress:
            import sys

            print(f"minfer: {cpu_calibration.refusal_note(gf.path.name, quant_note)}", file=sys.stderr)
        if device == "cpu":  # a model whose first logits are NaN/inf is refused here (issue 15)
            from minfer.runtime.sampling import check_model_logits

            check_model_logits(eng)
        if device == "cuda":
            import sys

            from minfer.device import cuda_backend

            compile_watch.install(sys.stderr if progress else None)   # a note when kernels compile (first run)
            torch.cuda.synchronize()
            eng.stats["load_s"] = time.perf_counter() - t0
            eng.memory_report = (f"{cuda_backend().memory_report(m.qweights(), eng.ctx.workspace, sw, m.act_dtype)}, "
                                 f"{cache_note(eng)}")
            if progress:
                import sys

                off = ", ".join(f"{e}=0" for e in sw.off().values())
                print(f"minfer: loaded {gf.path.name} in {eng.stats['load_s']:.1f} s: "
                      f"{eng.memory_report}{f'; switched off: {off}' if off else ''}", file=sys.stderr)
        return eng

    def set_switches(self, switches: Switches) -> None:
        """Use other switches from now on (an A/B passes changed copies). Captured graphs are
        dropped, since they replay what was captured under the old switches (kept when only
        _OUTSIDE_GRAPHS change). Switches that act at load (act_dtype, gemv_repack, threads)
        cannot change here: compare them in two runs."""
        diff = [f for f in dataclasses.fields(Switches) if getattr(switches, f.name) != getattr(self.switches, f.name)]
        for f in diff:
            if f.metadata["when"] == "load":
                raise MinferError(f"{f.metadata['env']} acts at load; it cannot change on a loaded "
                                  f"engine (compare it in two runs)")
        if not diff:
            return
        self.switches = switches
        self.ctx = Context(switches, self.ctx.workspace)
        if {f.name for f in diff} <= _OUTSIDE_GRAPHS:   # read when generate() makes its draw
            return
        if self.device.type == "cuda" and switches.gemv_repack:
            self._plane_layout()
        self._graph = None
        self._prefill_graphs = None

    def _plane_layout(self) -> None:
        """The repacked planes in the layout the switches ask for (ops/cuda/plane_layout.py: the
        tile-major shapes of the Gluon GEMV's table); set_switches drops this engine's graphs after
        it (a graph captured elsewhere on the same model, e.g. a BatchEngine's, would still read
        the old planes: change MINFER_GEMV_TILES only on an engine whose model no one else runs)."""
        from minfer.ops.cuda import plane_layout

        plane_layout.apply(self.model.qweights(), self.switches, self.device)

    def prefill_chunk(self) -> int:
        return self.switches.prefill_chunk or PREFILL_CHUNK.get(self.device.type, 512)

    def reset(self) -> None:
        """Forget the cached tokens (the cache memory is kept and overwritten)."""
        self.tokens = []
        self._epoch += 1

    def close(self) -> None:
        """Free the model's weights, the KV cache and the captured graphs now (CUDA memory
        included) instead of when the last reference goes. Any later call on this Engine is a
        MinferError; closing twice is allowed. `with minfer.load(...) as eng:` closes at the end."""
        if self._closed:
            return
        with self._busy():
            self._closed = True
            self._epoch += 1
            self.model = self.cache = self._graph = self._prefill_graphs = None
            self.ctx = None
            self.tokens = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self) -> "Engine":
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live(self) -> None:
        if self._closed:
            raise MinferError("this Engine was closed (Engine.close() or the end of its `with` block); "
                              "load the model again with minfer.load(...)")

    @contextlib.contextmanager
    def _busy(self):
        """Hold the engine for one computation. The cache and `tokens` are one sequence's state:
        a second thread computing at the same time would interleave two sequences in them and
        return wrong text without an error, so it is refused instead of waiting (a wait would
        still mix the two generations' steps)."""
        self._acquire()
        try:
            yield
        finally:
            self._lock.release()

    def _release_after_interrupt(self) -> None:
        """After a KeyboardInterrupt in this thread's call (the chat's Ctrl-C), which can land between the
        lock's acquire and its try; only for a caller whose thread alone runs this engine. The state
        is whole: a call cuts `tokens` before computing and appends only after."""
        if self._lock.locked():
            self._lock.release()

    def _acquire(self) -> None:
        """_busy's lock, taken without waiting (forward() takes it directly: a generator
        context costs ~1.5 us a decode token)."""
        if not self._lock.acquire(blocking=False):
            raise MinferError("this Engine is already running a call in another thread: an Engine runs one "
                              "call at a time; use one Engine per thread, or `minfer serve --parallel N` "
                              "for concurrent requests")

    # ---- forward passes ----------------------------------------------------------------

    def _check(self, tokens: Sequence[int], start_pos: int) -> None:
        if start_pos < 0 or start_pos > len(self.tokens):
            raise MinferError(f"start_pos {start_pos} is past the {len(self.tokens)} cached tokens")
        if 0 < start_pos < len(self.tokens) and getattr(self.model, "recurrent", False):
            raise MinferError(f"start_pos {start_pos} is inside the {len(self.tokens)} cached tokens: {self.config.arch}'s "
                              "recurrent state holds the whole cached sequence and cannot be rewound; continue at "
                              f"{len(self.tokens)} or start again at 0")
        if start_pos + len(tokens) > self.n_ctx:
            raise MinferError(f"{start_pos + len(tokens)} tokens do not fit in the context of {self.n_ctx} "
                              f"tokens; use a larger --ctx (the model was trained on up to "
                              f"{self.config.context_length}) or a shorter input")
        bad = [t for t in tokens if not 0 <= int(t) < self.config.vocab]
        if bad:
            raise MinferError(f"token id {bad[0]} is outside the vocabulary of {self.config.vocab}")

    def _run(self, tokens: Sequence[int], start_pos: int, last_only: bool, on_device: bool = False) -> torch.Tensor:
        """Logits (T or 1, V) float32 on the CPU; on_device: left on the device (a graph's
        buffer, valid until the next call). In inference mode (cuda_graphs.inference_scope)."""
        with inference_scope():
            return self._run_inference(tokens, start_pos, last_only, on_device)

    def _run_inference(self, tokens: Sequence[int], start_pos: int, last_only: bool, on_device: bool) -> torch.Tensor:
        tokens = [int(t) for t in tokens]
        self._check(tokens, start_pos)
        del self.tokens[start_pos:]        # in place: a copy of the whole history per decode step costs ~15 us at 3k tokens
        if len(tokens) == 1 and self._use_graph():
            sw = self.switches
            reuse = sw.pinned_io and sw.graph_host_reuse and not on_device     # to_host synchronizes next
            logits = self._graph_step(tokens[0], start_pos, host_sync=reuse, scoped=True)   # (1, V) float32 on the GPU
            self.tokens.append(tokens[0])
            if on_device:
                return logits
            if sw.pinned_io:
                return self._graph.to_host(logits, reuse=reuse)
            return logits.float().cpu()
        if start_pos == 0 and last_only and self._use_prefill_graph(len(tokens)):
            try:
                logits = self._prefill_graphs.run(tokens)            # (1, V) on the GPU
                self.tokens = list(tokens)
                return logits.float() if on_device else logits.float().cpu()
            except RuntimeError as e:   # a capture the driver refused: eager from now on, and said so
                from minfer.ops import paths

                paths.fallback("graph.prefill.replay", f"capture failed: {str(e).splitlines()[0][:100]}")
                self._prefill_graphs = False
        outs = []
        chunk_len = self.prefill_chunk()
        for i in range(0, len(tokens), chunk_len):
            chunk = tokens[i:i + chunk_len]
            ids = torch.tensor(chunk, dtype=torch.long, device=self.device)
            last = i + chunk_len >= len(tokens)
            step = Step.at(start_pos + i, len(chunk), self.device, "last" if last_only else "all")
            out = self.model.forward(ids, step, self.cache, self.ctx)
            if last or not last_only:
                outs.append(out)
            self.tokens.extend(chunk)
        out = torch.cat(outs).float() if len(outs) > 1 else outs[0].float()
        return out if on_device else out.cpu()

    def _use_graph(self) -> bool:
        """Decode steps on CUDA replay a captured graph unless Switches.cuda_graph is off."""
        if self.device.type != "cuda":
            return False
        if not self.switches.cuda_graph:
            from minfer.ops import paths

            paths.switched_off("graph.decode.replay", "MINFER_CUDA_GRAPH")
            return False
        return True

    def _use_prefill_graph(self, n: int) -> bool:
        """A short prompt's prefill from position 0 on CUDA replays a graph of its padded length
        unless Switches.prefill_graph is off; see runtime/prefill_graphs.py."""
        if self.device.type != "cuda" or getattr(self.model, "recurrent", False):   # padding would run through a recurrent state
            return False
        if not self.switches.prefill_graph:
            from minfer.ops import paths

            paths.switched_off("graph.prefill.replay", "MINFER_PREFILL_GRAPH")
            return False
        if self._prefill_graphs is False:      # a capture failed earlier (counted as a fallback)
            return False
        if self._prefill_graphs is None:
            from minfer.runtime.prefill_graphs import PrefillGraphs

            self._prefill_graphs = PrefillGraphs(self.model, self.cache, self.ctx)
        return self._prefill_graphs.fits(n)

    def _graph_step(self, token: int, pos: int, token_dev: torch.Tensor | None = None,
                    host_sync: bool = False, scoped: bool = False) -> torch.Tensor:
        """One graphed decode step. scoped: the caller is inside inference_scope already (_run), so
        the step does not enter it again (~3 us a token on the H200 machines' CPUs, perf-log U2)."""
        if self._graph is None:
            self._graph = DecodeGraph(self.model, self.cache, self.ctx)
        sw = self.switches
        if not sw.decode_short_graph:
            from minfer.ops import paths

            paths.switched_off("graph.decode.replay.short", "MINFER_DECODE_SHORT_GRAPH")
        if host_sync and not sw.graph_io:
            from minfer.ops import paths

            paths.switched_off("graph.decode.replay.io", "MINFER_GRAPH_IO")
        step = self._graph._step if scoped else self._graph.step
        return step(token, pos, sw.pinned_io, token_dev, host_sync, sw.decode_short_graph, sw.graph_io)

    def forward(self, tokens, start_pos: int) -> torch.Tensor:
        """tokens (T,) at positions start_pos.. -> logits (T, vocab) float32 (CPU). The cache keeps
        positions [0, start_pos) and gets these tokens appended."""
        self._live()
        tokens = check_prompt_ids(tokens, "tokens")
        if len(tokens) == 0:
            raise MinferError("forward() needs at least one token")
        self._acquire()                   # _busy() without its generator
        try:
            self._epoch += 1
            return self._run(tokens, start_pos, last_only=False)
        finally:
            self._lock.release()

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Every position's logits of the sequence `ids` from an empty context: (T, vocab)
        float32 on the CPU; row i scores the token after ids[i] (scoring, evaluation). The cache
        holds ids afterwards."""
        return self.forward(ids, 0)

    def prefill(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Bring the cache to hold prompt_ids, re-using the longest cached prefix; logits (V,)
        of the last prompt token."""
        self._live()
        prompt_ids = check_prompt_ids(prompt_ids)
        self._check_prompt(prompt_ids)
        with self._busy():
            return self._prefill(prompt_ids)

    def _prefill(self, prompt_ids: list[int], on_device: bool = False) -> torch.Tensor:
        self._epoch += 1
        n = 0
        limit = min(len(self.tokens), len(prompt_ids) - 1)  # at least one token is recomputed
        while n < limit and self.tokens[n] == prompt_ids[n]:
            n += 1
        if n < len(self.tokens) and getattr(self.model, "recurrent", False):
            n = 0          # its state covers all cached tokens: a shorter prefix is recomputed (module doc)
        return self._run(prompt_ids[n:], n, last_only=True, on_device=on_device)[-1]

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise MinferError("the prompt is empty: at least one token is needed")
        if len(prompt_ids) > self.n_ctx:
            raise MinferError(f"the prompt has {len(prompt_ids)} tokens but the context holds "
                              f"{self.n_ctx}; use a larger context (minfer.load(ctx=N), --ctx N; the model "
                              f"was trained on up to {self.config.context_length}) or a shorter prompt")

    # ---- generation ----------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                 max_new_tokens: int | None = None, stop: Iterable[str] | str | None = (),
                 top_logprobs: int = 0, logits_processors: Sequence = (), skip_special: bool = False,
                 **sampling) -> Iterator[GenEvent]:
        """Stream the continuation of `prompt_ids` (token ids: eng.tokenizer.encode(text), or
        minfer.tokenizer.chat_template.chat_token_ids for messages): an iterator of GenEvents, one per new
        token, each with .token_id, .text (the new text to show; '' while a possible stop string
        is held back, and always '' when the engine has no tokenizer), .logprob (the model's
        log-probability of the token), .top_logprobs ([(id, logprob)] of the top_logprobs most
        likely tokens) and .finish_reason (None, then 'stop' or 'length' on the last event).

        params: SamplingParams (default SamplingParams(): temperature 0.8, top_k 40, top_p 0.95,
        min_p 0.05; temperature=0 is greedy, seed=N repeats a draw), or its fields as keywords
        (generate(ids, temperature=0, seed=1), as complete() takes them). max_new_tokens: None = until
        the context is full. stop: a string or a list of strings that end the text (not included).
        logits_processors: see runtime/generate.py (e.g. a grammar's token mask). skip_special: control
        tokens' text (<|im_start|>) is left out of .text, and of what stop strings see. The arguments
        are checked here, at the call; the prompt is computed (and an empty or too long one
        refused) at the first next()."""
        self._live()
        prompt_ids = check_prompt_ids(prompt_ids)
        if sampling:
            if params is not None:
                raise MinferError(f"params and sampling keywords ({', '.join(sampling)}) were both given: "
                                  "pass one of them")
            params = sampling_from_kwargs(sampling)
        params = check_params(params)
        max_new_tokens = check_count("max_new_tokens", max_new_tokens, allow_none=True)
        stop = check_stop(stop)
        top_logprobs = check_count("top_logprobs", top_logprobs)
        logits_processors = list(logits_processors or ())
        for i, proc in enumerate(logits_processors):
            if not callable(proc):
                raise MinferError(f"logits_processors[{i}]: expected a callable (generated, logits) -> "
                                  f"logits, got {type(proc).__name__}")
        if stop and self.tokenizer is None:
            raise MinferError("stop strings need a tokenizer, and this engine has none")
        if not isinstance(skip_special, bool):
            raise MinferError(f"skip_special: expected True or False, got {type(skip_special).__name__}")
        return self._generate(prompt_ids, params, max_new_tokens, stop, top_logprobs, logits_processors, skip_special)

    def _generate(self, prompt_ids, params, max_new_tokens, stop, top_logprobs, logits_processors, skip_special):
        t0, c0 = time.perf_counter(), compile_watch.seconds()
        # CUDA: the next token chosen on the GPU, only it read back (device_draw.py);
        # a logits processor (a grammar's mask) works on the host's copy of the logits
        device_draw = self.device.type == "cuda" and self.switches.device_sampling and not logits_processors
        self._live()
        self._check_prompt(prompt_ids)
        with self._busy():
            logits = self._prefill(prompt_ids, on_device=device_draw)
        epoch = self._epoch           # a later prefill/forward/reset bumps it: this cache is gone
        t1 = time.perf_counter()
        room = self.n_ctx - len(prompt_ids) + 1   # the last new token is never fed back
        n_new = room if max_new_tokens is None else min(max_new_tokens, room)
        # finish_reason: what complete()/chat() callers, who see only the text, can ask afterwards
        self.stats = {"prompt_tokens": len(prompt_ids), "prompt_s": t1 - t0, "gen_tokens": 0, "gen_s": 0.0,
                      "compile_s": compile_watch.seconds() - c0, "finish_reason": "length" if n_new == 0 else None}

        def step(tok: int) -> torch.Tensor:
            self._live()
            if self._epoch != epoch:
                raise MinferError("this generate() iterator was resumed after a later call on the same Engine "
                                  "replaced its cache: one generation at a time per Engine (finish or drop the "
                                  "first iterator, or use a second Engine)")
            if draw is not None and draw.pending is not None:
                # launched ahead from the device token (device_draw.py): now known to be `tok`
                logits, draw.pending = draw.pending, None
                self.tokens.append(tok)
                return logits[-1]
            with self._busy():
                return self._run([tok], len(self.tokens), last_only=True, on_device=device_draw)[-1]

        def feed(tok_dev: torch.Tensor) -> torch.Tensor | None:
            # the next decode step from a token still on the device; its id joins `tokens` in
            # step() once the host has read it (a generation that ends first never adds it)
            from minfer.ops import paths

            self._live()
            if self._epoch != epoch or len(self.tokens) >= self.n_ctx:
                return None
            with self._busy():
                paths.count("sampling.device.ahead")
                return self._graph_step(0, len(self.tokens), token_dev=tok_dev)

        tok = self.tokenizer
        decoder = None if tok is None else tok.stream_decoder(True) if skip_special else tok.stream_decoder()
        eog = set(tok.eog_ids) if tok is not None else set()
        draw = None
        if self.device.type == "cuda" and not logits_processors:
            from minfer.ops import paths

            if device_draw:
                from minfer.runtime.device_draw import DeviceDraw

                # one step ahead only on the graphed decode (the eager one takes host token ids)
                draw = DeviceDraw(params, top_logprobs, feed if self._use_graph() else None,
                                  fused=self.switches.fused_draw)
                paths.count("sampling.device")
            else:
                paths.switched_off("sampling.device", "MINFER_DEVICE_SAMPLING")
        for ev in generate(logits, step, params, n_new, history=prompt_ids, stop=stop, decoder=decoder,
                           eog_ids=eog, top_logprobs=top_logprobs, logits_processors=logits_processors, draw=draw):
            self.stats["gen_tokens"] += 1
            self.stats["gen_s"] = time.perf_counter() - t1
            self.stats["compile_s"] = compile_watch.seconds() - c0   # Triton's compiles within the times
            if ev.finish_reason:
                self.stats["finish_reason"] = ev.finish_reason
            yield ev

    def complete(self, prompt: str, max_tokens: int | None = 256, stop: Iterable[str] | str | None = (),
                 **sampling) -> str:
        """The text generated after `prompt` (a str, continued as plain text, no chat template),
        up to max_tokens new tokens (None: until the context is full) or a stop string (a str or
        a list; not included in the result). Sampling keywords are SamplingParams fields:
        temperature (0 = greedy; default 0.8), top_k, top_p, min_p, repeat_penalty,
        presence_penalty, frequency_penalty, penalty_last_n, seed. Afterwards eng.stats says why
        the text ended ("finish_reason": 'stop' for the end of turn or a stop string, 'length')
        and the token counts and times. To stream, or for logprobs, use generate(); for a chat
        model's turns, chat()."""
        self._live()
        if self.tokenizer is None:
            raise MinferError("complete() needs a tokenizer, and this engine has none")
        if not isinstance(prompt, str):
            raise MinferError(f"prompt: expected a str, got {type(prompt).__name__}; for token ids use "
                              "generate(ids), for a list of messages chat(messages)")
        params = sampling_from_kwargs(sampling)
        max_tokens = check_count("max_tokens", max_tokens, allow_none=True)
        ids = self.tokenizer.encode(prompt)
        return "".join(ev.text for ev in self.generate(ids, params, max_tokens, stop=stop))

    def chat(self, messages: list[dict], max_tokens: int | None = 256, stop: Iterable[str] | str | None = (),
             continue_final_message: bool = False, **sampling) -> str:
        """The assistant's reply to `messages` ([{"role": "system"|"user"|"assistant", "content":
        str}, ...]), rendered with the model's own chat template (tokenizer.chat_template in the
        GGUF) and ended by the model's end of turn. Text in a content that spells a control token
        (<|im_end|>) stays plain text. max_tokens, stop and the sampling keywords as complete().
        continue_final_message: the last message, an assistant one, is left open and the reply goes on with it.
        To stream a reply: eng.generate(chat_token_ids(eng.tokenizer, messages), params, n), with
        chat_token_ids from minfer.tokenizer.chat_template."""
        self._live()
        if self.tokenizer is None:
            raise MinferError("chat() needs a tokenizer, and this engine has none")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise MinferError(f"messages: expected a non-empty list of {{'role': str, 'content': str}} dicts, "
                              f"got {type(messages).__name__}" + (" (empty)" if isinstance(messages, (list, tuple)) else ""))
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise MinferError(f"messages[{i}]: expected a dict {{'role': str, 'content': str}}, got "
                                  f"{(repr(m) if isinstance(m, dict) else type(m).__name__)[:80]}")
        from minfer.tokenizer.chat_template import chat_token_ids

        params = sampling_from_kwargs(sampling)
        max_tokens = check_count("max_tokens", max_tokens, allow_none=True)
        if not isinstance(continue_final_message, bool):
            raise MinferError(f"continue_final_message: expected True or False, got {type(continue_final_message).__name__}")
        ids = chat_token_ids(self.tokenizer, list(messages), continue_final_message=continue_final_message,
                             add_generation_prompt=not continue_final_message)
        return "".join(ev.text for ev in self.generate(ids, params, max_tokens, stop=stop))


def load_tokenizer(gf):
    """The GGUF's tokenizer."""
    from minfer.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gf)
