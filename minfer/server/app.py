"""The OpenAI-compatible HTTP server: FastAPI app over one Engine and one generation thread.

    client --HTTP--> middlewares (metrics, auth, body limit) --> route
      route: validate (schemas.py) -> render/tokenize -> Job --FIFO--> worker thread (worker.py)
      worker: engine.generate(...) --GenEvent--> Job's asyncio.Queue --> JSON or SSE chunks

The model loads in a background thread started by the app's lifespan, so the socket answers at once: /health
says 503 until the engine is ready. Every error leaves as OpenAI's error object {"error": {"message", "type",
"param", "code"}} with a 4xx/5xx status; nothing a client sends can stop the server. Response formats follow
OpenAI's API reference (chat.completion, chat.completion.chunk, text_completion objects).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from minfer.errors import MinferError
from minfer.limits import request_problem, request_texts
from minfer.server.metrics import ServerMetrics
from minfer.server.middleware import (AuthMiddleware, BodyLimitMiddleware, BodyNotJSON, JSONBodyMiddleware,
                                      MetricsMiddleware, error_payload, json_route_class)
from minfer.server.prompting import completion_add_special, encode_prompt, skip_special
from minfer.server.embed_routes import add_embed_routes, refuse_generation
from minfer.server.token_routes import add_token_routes
from minfer.server.render import Accumulator, chat_chunk, chat_response, completion_chunk, completion_response
from minfer.server.schemas import (MAX_STOP, ChatCompletionRequest, ChatMessage, CompletionRequest, FunctionDef,
                                   JSONSchemaFormat, NamedToolChoice, OtherPart, ResponseFormat, StreamOptions,
                                   TextPart, Tool, ToolCall, ToolCallFunction, _Sampling, unsupported_fields)
from minfer.server.structured import GrammarConstraint, GrammarError, json_schema_grammar
from minfer.server.tools import ToolError, logit_bias, plan_chat, response_schema, tool_chunker, tool_message
from minfer.server.worker import Failed, Finished, GenRequest, Job, ShuttingDown, Worker
from minfer.tokenizer.chat_template import chat_token_ids

log = logging.getLogger("minfer.server")

DEFAULT_MAX_BODY = 8 * 1024 * 1024
BATCH_NOTE = ("requests run together (continuous batching over a paged KV cache); requests beyond "
              "the slots wait and are admitted first come, first served")
SHUTDOWN_MESSAGE = ("the server is shutting down; the generation was stopped (send the request again once "
                    "it is back)")
SCHEDULING_NOTE = ("one request generates at a time; other requests wait in a first-in first-out "
                   "queue and are served in arrival order")


class APIError(Exception):
    """An error answered to the client as an OpenAI error object."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_payload(self.message, self.type, self.code, self.param), status_code=self.status)


class ServerState:
    """What the routes share: the engine once loaded, its worker, the metrics."""

    def __init__(self, engine_factory: Callable[[], Any], served_name: str, aliases: list[str],
                 on_load_failed: Callable[[BaseException], None] | None, params_cls: Any) -> None:
        self.engine_factory = engine_factory
        self.params_cls = params_cls
        self.served_name = served_name
        self.names = {served_name, *aliases}
        self.on_load_failed = on_load_failed
        self.metrics = ServerMetrics()
        self.engine: Any = None
        self.worker: Worker | None = None
        self.load_error: BaseException | None = None
        self.created = int(time.time())
        self._loader: threading.Thread | None = None
        self.parallel: int | None = None     # > 1: a BatchWorker runs that many sequences at once
        self.kv_memory: int | None = None    # bytes of paged KV cache (None: from free memory)
        self.token_budget: int | None = None  # tokens per batch-engine step (None: the device's default)
        self.slots = 1
        self.step_budget: int | None = None   # the batch engine's tokens per step, once built
        self.seq_limit: int | None = None     # positions one sequence holds, when the KV pool is smaller

    def start_loading(self) -> None:
        self._loader = threading.Thread(target=self._load, name="minfer-load", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        try:
            engine = self.engine_factory()
            worker = self._make_worker(engine).start()
        except BaseException as e:  # report any failure through /health rather than dying silently
            log.error("loading the model failed: %s", e)
            self.load_error = e
            if self.on_load_failed:
                self.on_load_failed(e)
            return
        self.worker = worker
        self.engine = engine  # set last: a non-None engine means ready
        log.info("model ready: %s (context %s tokens)", self.served_name, getattr(engine, "n_ctx", "?"))

    def _make_worker(self, engine: Any) -> Any:
        """The FIFO Worker, or with parallel > 1 a BatchWorker over a BatchEngine (paged KV cache,
        continuous batching; minfer/server/worker.py)."""
        if self.parallel is None or self.parallel == 1:
            self.metrics.slots.set(1)   # what /health says; a BatchEngine sets its own at each scrape
            return Worker(engine, on_finished=self._record, on_dequeue=self.metrics.queued.dec)
        from minfer.runtime.batch_engine import BatchEngine
        from minfer.server.worker import BatchWorker

        kw = {} if self.token_budget is None else {"token_budget": self.token_budget}
        batch = BatchEngine.from_engine(engine, max_seqs=self.parallel or None, kv_memory=self.kv_memory, **kw)
        self.slots = batch.max_seqs
        self.step_budget = batch.scheduler.token_budget
        if self.token_budget is not None and self.step_budget != self.token_budget:
            # -np 0 on CUDA: the slots came from memory, after `minfer serve` checked the flags
            log.warning("--token-budget %d is below the %d sequences served at once: each step carries "
                        "one token per running sequence, so a step takes %d", self.token_budget,
                        self.slots, self.step_budget)
        info = batch.slots_info()
        log.info("batching: %d sequences at once, KV cache %d blocks of %d positions, %d tokens per step",
                 self.slots, info["kv_blocks_total"], info["kv_block_size"], self.step_budget)
        held = info["kv_blocks_total"] * info["kv_block_size"]
        if held < int(engine.n_ctx):
            self.seq_limit = held
            # `minfer serve` refuses such a --kv-memory before the load; on CUDA the default pool is
            # sized from the memory left after it, which a long --ctx can outgrow
            log.warning("the KV cache holds %d positions, less than one full context (%d tokens): a "
                        "prompt past that is refused and answers stop there; give a larger --kv-memory "
                        "or a smaller --ctx", held, int(engine.n_ctx))
        t0 = time.perf_counter()
        n = batch.warm_graphs()       # before "ready": no capture or kernel compile under the first requests
        if n:
            log.info("captured %d batch decode graphs in %.1f s", n, time.perf_counter() - t0)
        self.metrics.bind_engine(batch.slots_info)
        return BatchWorker(engine, batch, on_finished=self._record, on_dequeue=self.metrics.queued.dec)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def _record(self, fin: Finished) -> None:
        m = self.metrics
        if not fin.skipped:
            m.prompt_tokens.inc(fin.n_prompt)
        m.generated_tokens.inc(fin.n_generated)
        if fin.cancelled:
            m.cancelled.inc()
        if fin.prompt_seconds:
            m.prompt_tps.observe(fin.n_prompt / fin.prompt_seconds)
        if fin.decode_seconds:
            m.generation_tps.observe((fin.n_generated - 1) / fin.decode_seconds)
        if not fin.skipped:
            m.observe_finished(fin.prompt_seconds, fin.inter_token_seconds)

    def require_engine(self) -> Any:
        if self.engine is not None:
            return self.engine
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", "server_error", "model_load_failed")
        raise APIError(503, "the model is still loading; retry when GET /health answers 200",
                       "server_error", "model_loading")

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise APIError(404, f"The model `{name}` does not exist: this server serves "
                           f"`{self.served_name}` (see GET /v1/models)",
                           "invalid_request_error", "model_not_found", "model")


def _sampling_params(req: _Sampling, SamplingParams: Any) -> Any:
    """SamplingParams from the request; fields the client did not send keep the engine's defaults."""
    sent = req.model_fields_set
    kw: dict[str, Any] = {}
    for field, param in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                         ("min_p", "min_p"), ("presence_penalty", "presence_penalty"),
                         ("frequency_penalty", "frequency_penalty"), ("repetition_penalty", "repeat_penalty"),
                         ("seed", "seed")):
        value = getattr(req, field)
        if field == "seed" and value == -1:
            continue  # llama.cpp's server: seed -1 means a random seed, not the seed -1
        if field in sent and value is not None:
            kw[param] = max(value, 0) if field == "top_k" else value  # -1 (llama.cpp's 'off') -> 0
    return SamplingParams(**kw)      # (a temperature under limits.GREEDY_BELOW becomes greedy there)


def _check_common(state: ServerState, req: _Sampling) -> Any:
    engine = state.require_engine()
    state.check_model(req.model)
    refuse_generation(engine)     # an encoder (bert) generates nothing: a 400 (embed_routes.py)
    # sizes and valid Unicode before any rendering or tokenization (minfer/limits.py)
    problem = request_problem(request_texts(req), len(getattr(req, "messages", None) or ()))
    if problem is not None:
        raise APIError(400, problem[1], code="invalid_value", param=problem[0])
    if req.n != 1:
        raise APIError(400, f"n={req.n} is not supported: this server returns exactly one choice "
                       "per request (n=1); send several requests instead", code="unsupported_value", param="n")
    for name, why in unsupported_fields(req):
        raise APIError(400, f"{name}: {why}", code="unsupported_value", param=name)
    return engine


async def chat_plan(state: ServerState, tok: Any, req: ChatCompletionRequest) -> Any:
    """The chat request's tools.ChatPlan (prompt ids, grammar, logit bias), its failures as 400s naming the field;
    off the event loop: a long conversation takes a while to render and tokenize, and a grammar takes milliseconds
    to compile (the vocab's adapter ~0.5 s, once). /v1/chat/completions and /tokenize's chat form."""
    try:
        return await run_in_threadpool(plan_chat, tok, req, lambda messages, extra: chat_token_ids(
            tok, messages, special_in_content=state.special_in_content, **extra))
    except ToolError as e:
        raise APIError(400, str(e), code=e.code, param=e.param) from e
    except MinferError as e:
        raise APIError(400, f"messages: {e}", code="invalid_messages", param="messages") from e


def _make_job(state: ServerState, engine: Any, req: _Sampling, prompt_ids: list[int],
              processors: list | None = None) -> Job:
    n_ctx = int(engine.n_ctx)
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise APIError(400, "the prompt is empty (0 tokens)", code="empty_prompt", param="prompt")
    # a batch KV pool under one context holds fewer positions (the batch engine refused such a
    # prompt, which answered 500 "generation failed")
    held = f" (the KV cache holds {state.seq_limit}: --kv-memory)" if state.seq_limit else ""
    n_ctx = min(n_ctx, state.seq_limit or n_ctx)
    if n_prompt > n_ctx:
        raise APIError(400, f"This model's maximum context length is {n_ctx} tokens{held}, but the prompt "
                       f"has {n_prompt} tokens. Shorten the prompt or start the server with a larger --ctx.",
                       code="context_length_exceeded",
                       param="messages" if isinstance(req, ChatCompletionRequest) else "prompt")
    # the engine stores prompt + answer but never feeds back the last new token (engine.py)
    room = n_ctx - n_prompt + 1
    asked = req.max_new()
    # a max_tokens past the end of the context is clamped: the answer then ends with 'length'
    max_new = room if asked is None else min(asked, room)
    try:
        params = _sampling_params(req, state.params_cls)
    except (TypeError, ValueError, MinferError) as e:
        raise APIError(400, f"invalid sampling parameters: {e}", code="invalid_value") from e
    n_top = req.n_top_logprobs()
    # the chosen token's own logprob comes with every event; alternatives only when asked for
    return Job(GenRequest(prompt_ids, params, max_new, req.stop_list(), n_top or 0, list(processors or []),
                          skip_special(req)), asyncio.get_running_loop())


def _submit(state: ServerState, job: Job) -> None:
    state.metrics.queued.inc()
    state.worker.submit(job)


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancels the job when the client hangs up. The body has been read, so the next ASGI
    message can only be http.disconnect (Starlette's StreamingResponse listens the same way)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _collect(job: Job, request: Request, acc: Accumulator) -> Finished:
    """All events of a non-streaming job into `acc`. A client that hangs up cancels the job."""
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        while True:
            item = await job.get()
            if isinstance(item, Finished):
                if item.cancelled:  # nobody is listening; uvicorn drops the answer
                    raise APIError(499, "client closed the request", code="client_closed_request")
                return item
            if isinstance(item, Failed):
                if isinstance(item.error, ShuttingDown):
                    raise APIError(503, SHUTDOWN_MESSAGE, "server_error", "server_shutting_down")
                raise APIError(500, f"generation failed: {type(item.error).__name__}: {item.error}",
                               "server_error", "internal_error") from item.error
            acc.add(item)
    finally:
        watcher.cancel()
        job.cancel()  # no-op when finished; stops the worker when this coroutine is cancelled


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def _stream(job: Job, first: list[dict], make_chunk: Callable[..., dict], acc: Accumulator,
                  include_usage: bool, usage_chunk: Callable[[dict], dict]) -> AsyncIterator[bytes]:
    """SSE body: the opening chunks, one chunk per event with text or logprobs, the final chunk
    with finish_reason, optionally a usage chunk, then `data: [DONE]`. Starlette cancels this
    generator when the client disconnects; the finally clause then stops the generation."""
    try:
        for c in first:
            yield _sse(c)
        while True:
            item = await job.get()
            if isinstance(item, Finished):
                for c in _chunks(make_chunk(None, finish_reason=item.finish_reason)):
                    yield _sse(c)
                if include_usage:
                    yield _sse(usage_chunk(acc.usage(item)))
                break
            if isinstance(item, Failed):
                err = error_payload(SHUTDOWN_MESSAGE, "server_error", "server_shutting_down") \
                    if isinstance(item.error, ShuttingDown) else \
                    error_payload(f"generation failed: {type(item.error).__name__}: {item.error}",
                                  "server_error", "internal_error")
                yield _sse(err)
                break
            piece = acc.add(item)
            if piece is not None:
                for c in _chunks(make_chunk(piece)):
                    yield _sse(c)
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel()


def _chunks(c: dict | list[dict]) -> list[dict]:
    return c if isinstance(c, list) else [c]


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(engine_factory: Callable[[], Any], *, served_name: str, aliases: list[str] = (),
               api_key: str | None = None, max_body: int = DEFAULT_MAX_BODY,
               on_load_failed: Callable[[BaseException], None] | None = None,
               sampling_params_cls: Any = None, cors_origins: list[str] = (),
               parallel: int | None = None, kv_memory: int | None = None, token_budget: int | None = None,
               special_in_content: bool = False, pooling: str | None = None) -> FastAPI:
    """The server app. `engine_factory()` returns a loaded Engine; it runs in a background thread
    when the app starts (lifespan), so it may take long. `served_name` is the model id clients
    send and GET /v1/models lists; `aliases` are other names accepted for it. `cors_origins`:
    browser origins allowed to call the API ("*" for any); none by default.
    `sampling_params_cls` defaults to minfer.runtime.sampling.SamplingParams. `parallel` > 1
    serves that many requests at once (continuous batching over a paged KV cache of `kv_memory`
    bytes, default from free memory, `token_budget` tokens per engine step, default the device's
    TOKEN_BUDGET), 0 as many as memory allows; None or 1: one at a time, first in first out. pooling: embed_routes."""
    if sampling_params_cls is None:
        from minfer.runtime.sampling import SamplingParams as sampling_params_cls
    state = ServerState(engine_factory, served_name, list(aliases), on_load_failed, sampling_params_cls)
    state.parallel, state.kv_memory, state.token_budget = parallel, kv_memory, token_budget
    # False: control-token text in a client's message content stays text (issue 15)
    state.special_in_content = special_in_content
    if api_key is not None and not api_key.strip():
        raise MinferError("--api-key is empty: give a key, or leave the flag (and $MINFER_API_KEY) "
                          "unset to serve without authentication")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        yield
        state.shutdown()

    app = FastAPI(title="minfer", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.minfer = state
    app.router.route_class = json_route_class()   # POST bodies parsed first: BodyNotJSON

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc).response()

    @app.exception_handler(BodyNotJSON)
    async def _not_json(request: Request, exc: BodyNotJSON) -> JSONResponse:
        return APIError(400, str(exc), code="invalid_json").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code in (404, 405):   # a client (or a browser) at the wrong door: the right ones
            msg += f"; this server answers {ENDPOINTS}"
        return APIError(exc.status_code, msg, "invalid_request_error", code).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}", "server_error",
                        "internal_error").response()

    # HEAD too: uptime monitors and some load balancers probe with it (llama-server answers it)
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Any:
        state.require_engine()
        return {"status": "ok", "slots": state.slots}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    def model_card() -> dict:
        engine, slots = state.engine, state.slots
        if engine is None and state.parallel not in (None, 1):   # while loading: what -np asked for
            slots = state.parallel or None      # (-np 0: from the memory left after the load)
        meta: dict[str, Any] = {"loaded": engine is not None, "max_concurrent_requests": slots,
                                "scheduling": SCHEDULING_NOTE if slots == 1 else BATCH_NOTE}
        if engine is not None:
            meta["n_ctx"] = int(engine.n_ctx)
            if state.step_budget is not None:
                meta["token_budget"] = state.step_budget   # serve_bench records it beside its numbers
            meta["device"] = str(getattr(engine, "device", "?"))
            arch = getattr(getattr(engine, "config", None), "arch", None)
            if arch:
                meta["architecture"] = arch
        if len(state.names) > 1:
            meta["aliases"] = sorted(state.names - {state.served_name})
        return {"id": state.served_name, "object": "model", "created": state.created, "owned_by": "minfer",
                "meta": meta}

    # HEAD as well as GET: monitors and load balancers probe with HEAD (405 before)
    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    @app.api_route("/models", methods=["GET", "HEAD"], include_in_schema=False)
    async def models() -> Any:
        return {"object": "list", "data": [model_card()]}

    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    @app.api_route("/models/{model_id:path}", methods=["GET", "HEAD"], include_in_schema=False)
    async def model(model_id: str) -> Any:
        # OpenAI's retrieve; an alias answers with the served model's card
        state.check_model(model_id)
        return model_card()

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions", include_in_schema=False)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        engine = _check_common(state, req)
        tok = engine.tokenizer
        plan = await chat_plan(state, tok, req)
        job = _make_job(state, engine, req, plan.prompt_ids, plan.processors)
        acc = Accumulator(tok, req.n_top_logprobs(), chat=True, skip_special=skip_special(req))
        rid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.served_name
        _submit(state, job)
        if not req.stream:
            fin = await _collect(job, request, acc)
            resp = chat_response(rid, created, model, acc, fin)
            if plan.parse_tools:
                tool_message(resp, acc.text)
            return resp
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def plain_chunk(piece: Any, finish_reason: str | None = None, role: bool = False) -> dict:
            return chat_chunk(rid, created, model, piece, finish_reason, role, include_usage)

        chunk = tool_chunker(plain_chunk) if plan.parse_tools else plain_chunk

        def usage_chunk(usage: dict) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": usage}

        body = _stream(job, [plain_chunk(None, role=True)], chunk, acc, include_usage, usage_chunk)
        return StreamingResponse(body, media_type="text/event-stream", headers=_SSE_HEADERS)

    @app.post("/v1/completions")
    @app.post("/completions", include_in_schema=False)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        engine = _check_common(state, req)
        tok = engine.tokenizer
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo together with logprobs is not supported (no prompt logprobs)",
                           code="unsupported_value", param="echo")
        prompt = req.prompt
        try:
            add_special = completion_add_special(req)
        except ToolError as e:
            raise APIError(400, str(e), code=e.code, param=e.param) from e
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            n_vocab = int(getattr(tok, "n_vocab", 0) or 0)
            bad = [t for t in prompt if t < 0 or (n_vocab and t >= n_vocab)]
            if bad:
                raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary [0, {n_vocab})",
                               code="invalid_value", param="prompt")
            ids = list(prompt)
            text = tok.decode(ids) if req.echo else ""
        else:
            text = prompt if isinstance(prompt, str) else prompt[0]
            try:
                ids = await run_in_threadpool(encode_prompt, tok, text, add_special)
            except MinferError as e:
                raise APIError(400, f"prompt: {e}", code="invalid_value", param="prompt") from e
        try:
            processors = [logit_bias(tok, req.logit_bias)] if req.logit_bias else []
            schema = response_schema(req.response_format)
            if schema is not None:
                processors.append(await run_in_threadpool(GrammarConstraint, tok, json_schema_grammar(schema)))
        except ToolError as e:
            raise APIError(400, str(e), code=e.code, param=e.param) from e
        except GrammarError as e:
            raise APIError(400, f"response_format.json_schema.schema: {e}", code="invalid_value",
                           param="response_format.json_schema.schema") from e
        job = _make_job(state, engine, req, ids, processors)
        echo = text if req.echo else ""
        acc = Accumulator(tok, req.n_top_logprobs(), chat=False, base_offset=len(echo), skip_special=skip_special(req))
        rid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), state.served_name
        _submit(state, job)
        if not req.stream:
            fin = await _collect(job, request, acc)
            return completion_response(rid, created, model, acc, fin, echo)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(piece: Any, finish_reason: str | None = None) -> dict:
            return completion_chunk(rid, created, model, piece, finish_reason, include_usage)

        def usage_chunk(usage: dict) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage}

        first = [completion_chunk(rid, created, model, echo, None, include_usage)] if echo else []
        body = _stream(job, first, chunk, acc, include_usage, usage_chunk)
        return StreamingResponse(body, media_type="text/event-stream", headers=_SSE_HEADERS)

    add_token_routes(app, state)    # POST /tokenize, /detokenize (vLLM's and llama.cpp's shapes)
    add_embed_routes(app, state, pooling)    # POST /v1/embeddings (OpenAI's shape)
    # outermost last: metrics see every answer, auth runs before the body is buffered
    app.add_middleware(BodyLimitMiddleware, max_body=max_body)
    if api_key:
        app.add_middleware(AuthMiddleware, api_key=api_key)
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    app.add_middleware(JSONBodyMiddleware)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # outermost: a browser's preflight OPTIONS carries no API key and must not reach auth
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)
    return app


# what a field accepts, for a value that matched none of the members of its union type
_UNION_HINTS = {
    "stop": f"expected a string or a list of at most {MAX_STOP} strings",
    "prompt": "expected a string, a list holding one string, or a list of token ids (integers); "
              "one prompt per request",
    "content": 'expected a string or a list of text parts ({"type": "text", "text": "..."})',
}


ENDPOINTS = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/rerank, GET /v1/models, "
             "GET /health, GET /metrics")


def _field_names() -> set[str]:
    names: set[str] = set()
    for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, OtherPart, StreamOptions,
                  ResponseFormat, JSONSchemaFormat, Tool, FunctionDef, NamedToolChoice, ToolCall, ToolCallFunction):
        names.update(model.model_fields)
    return names


_FIELDS = _field_names()


def _validation_response(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 becomes OpenAI's 400 with one readable message naming the fields.

    pydantic reports a union mismatch once per member, with the member's name in the location
    ("stop.str", "stop.list[str]"); such locations are cut at the member name and merged."""
    groups: dict[str, list[dict]] = {}
    for e in exc.errors():
        loc = []
        for x in e.get("loc", ())[1:] if e.get("loc", ("",))[0] == "body" else e.get("loc", ()):
            if isinstance(x, str) and x not in _FIELDS:
                break  # a union member's tag: what follows describes one member only
            loc.append(str(x))
        groups.setdefault(".".join(loc), []).append(e)
    parts, param, code = [], None, "invalid_value"
    for where, errs in list(groups.items())[:5]:
        if any(e.get("type") == "missing" for e in errs):
            code = "missing_required_parameter"
            if not where:   # no body at all: "body: Field required" read like a field named body
                parts.append("the body is empty: expected a JSON object with the request's fields")
                continue
        if len(errs) > 1:
            hint = _UNION_HINTS.get(where.rsplit(".", 1)[-1]) or "; ".join(dict.fromkeys(e["msg"] for e in errs))
        else:
            hint = errs[0].get("msg", "invalid")
        # pydantic prefixes a validator's own message with "Value error, ": noise to a client
        parts.append(f"{where or 'body'}: {hint.replace('Value error, ', '')}")
        param = param or (where or None)
    if len(groups) > 5:
        parts.append(f"... and {len(groups) - 5} more")
    return APIError(400, "invalid request: " + "; ".join(parts), "invalid_request_error", code, param)


def _version() -> str:
    from minfer import __version__

    return __version__
