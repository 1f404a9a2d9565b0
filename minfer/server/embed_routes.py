"""POST /v1/embeddings: OpenAI's embeddings endpoint over the served model (runtime/embed.py computes).

The request, as OpenAI's API takes it: `input` a string, a list of strings, a list of token ids or a list
of those (at most MAX_INPUTS); `model`; `encoding_format` "float" (default) or "base64" (little-endian
float32 bytes: what the official Python client asks for unless told otherwise, and decodes itself);
`dimensions` (keep the first n values, then normalise: Matryoshka models); `user` (read and ignored, as it
changes no answer). Besides: vLLM's `normalize` (true / false) or llama.cpp's `embd_normalize` (-1 none,
0 int16 range, 1 taxicab, 2 euclidean, p > 2 p-norm); default euclidean, unit length, as OpenAI's vectors.
Every other field is a 400 naming it.

Texts are tokenized as /v1/completions reads a text prompt (control-token texts are tokens; BOS / EOS as
the vocab adds them: Qwen3-Embedding's EOS). The pooling is the server's --pooling, else the file's
`{arch}.pooling_type`; a file without one (a chat model) answers 400 until the server is started with
--pooling, and 'none' (a vector per token) is refused here as llama.cpp's server refuses it: OpenAI's
answer has one vector per input. The answer:
`{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}], "model", "usage":
{"prompt_tokens", "total_tokens"}}`.

POST /v1/rerank (and /rerank, /v1/reranking, /reranking: llama-server's aliases, tools/server/server.cpp) scores
documents against a query with a cross-encoder (a file with a classifier head: runtime/embed.py Engine.rerank's
rules), in Jina's / Cohere's shape as llama-server answers it (server-common.cpp format_response_rerank). The
request: `query` (a string), `documents` (a non-empty list of strings, at most MAX_INPUTS), `top_n` (an integer
>= 1; default all), `return_documents` (true: each result carries `document: {"text": ...}`, as Jina and Cohere
return it; default false, as llama-server, which never returns them in this shape), `model`. Every other field
is a 400 naming it. The answer: `{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"} (the
tokens of all pairs), "results": [{"index", "relevance_score"}]}`, highest score first (ties in input order),
cut to top_n; relevance_score is the head's raw logit (no sigmoid), as llama-server's. A model without a
classifier head answers 400 (llama-server: "This server does not support reranking")."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

MAX_INPUTS = 2048     # OpenAI's limit on the inputs of one request
_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "normalize", "embd_normalize"}
_RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents"}


def refuse_generation(engine: Any) -> None:
    """A 400 for a generation request (/v1/completions, /v1/chat/completions) to an encoder (Model.causal False:
    bert), which has no lm head and only embeds."""
    from minfer.server.app import APIError

    if not getattr(getattr(engine, "model", None), "causal", True):
        raise APIError(400, f"this model ({engine.config.arch}) is an encoder: it only embeds and generates nothing; "
                       "use POST /v1/embeddings", code="unsupported_value", param="model")


def add_embed_routes(app: FastAPI, state: Any, pooling: str | None) -> None:
    """POST /v1/embeddings (and /embeddings) on `app`; `pooling` the server's --pooling (None: the file's)."""
    import asyncio

    from minfer.server.app import APIError
    from minfer.server.worker import EmbedRequest, Embedded, Failed, Job, ShuttingDown

    def bad(msg: str, param: str, code: str = "invalid_value") -> APIError:
        return APIError(400, msg, code=code, param=param)

    def opened(body: Any, fields: set, first: str):
        """The engine, after the checks every request here starts with: a JSON object of known fields, the model."""
        if not isinstance(body, dict):
            raise bad("the body must be a JSON object", first)
        engine = state.require_engine()
        state.check_model(body.get("model"))
        for name in body:
            if name not in fields:
                raise bad(f"{name}: not a field of this request (it takes {', '.join(sorted(fields))})", name,
                          "unsupported_value")
        return engine

    def check(body: Any) -> tuple[Any, list, int, int | None, str]:
        engine = opened(body, _FIELDS, "input")
        items = _inputs(body.get("input"), bad)
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad(f"encoding_format: expected 'float' or 'base64', got {fmt!r}"[:120], "encoding_format")
        if "normalize" in body and "embd_normalize" in body:
            raise bad("normalize (vLLM) and embd_normalize (llama.cpp's server) say the same: give one", "normalize")
        norm = 2
        if body.get("normalize") is not None:
            if not isinstance(body["normalize"], bool):
                raise bad("normalize: expected true or false", "normalize")
            norm = 2 if body["normalize"] else -1
        if body.get("embd_normalize") is not None:
            v = body["embd_normalize"]
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise bad("embd_normalize: expected an integer >= -1 (-1 none, 0 int16 range, 1 taxicab, 2 euclidean, "
                          "p > 2 p-norm)", "embd_normalize")
            norm = v
        dims = body.get("dimensions")
        D = int(engine.config.d_model)
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= D):
            raise bad(f"dimensions: expected an integer in 1..{D} (the model's width)", "dimensions")
        return engine, items, norm, dims, fmt

    @app.post("/v1/embeddings")
    @app.post("/embeddings", include_in_schema=False)
    async def embeddings(body: dict) -> Any:
        from minfer.errors import MinferError
        from minfer.runtime.embed import pooling_of
        from minfer.server.prompting import encode_prompt

        engine, items, norm, dims, fmt = check(body)
        try:
            pool = pooling_of(engine.config, pooling, f"model {state.served_name}",
                              "start the server with --pooling mean or last")
        except MinferError as e:
            raise APIError(400, str(e), code="pooling_unavailable", param="input") from e
        if pool == "none":
            raise APIError(400, "this server pools with 'none' (a vector per token), which /v1/embeddings cannot "
                           "answer (one vector per input); start it with --pooling mean, cls or last",
                           code="pooling_unavailable", param="input")
        if pool == "rank":
            raise APIError(400, "this model's file pools with 'rank' (a reranker's classifier head): score documents "
                           "with POST /v1/rerank, or start the server with --pooling mean, cls or last",
                           code="pooling_unavailable", param="input")
        tok = engine.tokenizer
        n_ctx = int(engine.n_ctx)
        ids_list = []
        for i, it in enumerate(items):
            where = f"input[{i}]" if len(items) > 1 else "input"
            if isinstance(it, str):
                try:
                    ids = await run_in_threadpool(encode_prompt, tok, it)
                except MinferError as e:
                    raise bad(f"{where}: {e}", "input") from e
            else:
                ids = it
                bad_id = [t for t in ids if not 0 <= t < int(engine.config.vocab)]
                if bad_id:
                    raise bad(f"{where}: token id {bad_id[0]} is outside the vocabulary [0, {engine.config.vocab})",
                              "input")
            if not ids:
                raise bad(f"{where}: no tokens to embed (an empty text, and the model adds no BOS)", "input")
            if len(ids) > n_ctx:
                raise APIError(400, f"{where} has {len(ids)} tokens, more than this model's context of {n_ctx} "
                               "tokens; shorten it or start the server with a larger --ctx",
                               code="context_length_exceeded", param="input")
            ids_list.append(ids)
        item = await run_job(EmbedRequest(ids_list, pool, norm, dims), "input", "embeddings")
        n = sum(len(x) for x in ids_list)
        state.metrics.prompt_tokens.inc(n)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, fmt)} for i, v in enumerate(item.vectors)]
        return {"object": "list", "data": data, "model": state.served_name,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    async def run_job(req: Any, param: str, what: str) -> Any:
        """Queue `req` on the worker (the engine's thread, in its turn) and wait for its Embedded item."""
        from minfer.errors import MinferError

        job = Job(req, asyncio.get_running_loop())
        state.metrics.queued.inc()
        state.worker.submit(job)
        item = await job.get()
        if isinstance(item, Failed):
            if isinstance(item.error, ShuttingDown):
                from minfer.server.app import SHUTDOWN_MESSAGE

                raise APIError(503, SHUTDOWN_MESSAGE, "server_error", "server_shutting_down")
            if isinstance(item.error, MinferError):
                raise APIError(400, str(item.error), code="invalid_value", param=param)
            raise APIError(500, f"{what} failed: {type(item.error).__name__}: {item.error}", "server_error",
                           "internal_error") from item.error
        assert isinstance(item, Embedded)
        return item

    def check_rerank(body: Any) -> tuple[Any, Any, str, list[str], int | None, bool]:
        from minfer.errors import MinferError
        from minfer.runtime.embed import rank_head_of

        engine = opened(body, _RERANK_FIELDS, "query")
        try:
            head = rank_head_of(engine.model, engine.config, f"model {state.served_name}")
        except MinferError as e:
            raise APIError(400, f"this server does not rerank: {e}", code="unsupported_value", param="model") from e
        query = body.get("query")
        if not isinstance(query, str):
            raise bad("query: expected a string" + (" (it is required)" if query is None else ""), "query")
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs:
            raise bad("documents: expected a non-empty list of strings", "documents")
        for i, d in enumerate(docs):
            if not isinstance(d, str):
                raise bad(f"documents[{i}]: expected a string, got {type(d).__name__}", "documents")
        if len(docs) > MAX_INPUTS:
            raise bad(f"documents: {len(docs)} documents, more than the {MAX_INPUTS} one request takes", "documents")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise bad("top_n: expected an integer >= 1", "top_n")
        ret = body.get("return_documents", False)
        if ret is None:
            ret = False
        if not isinstance(ret, bool):
            raise bad("return_documents: expected true or false", "return_documents")
        return engine, head, query, docs, top_n, ret

    @app.post("/v1/rerank")
    @app.post("/rerank", include_in_schema=False)
    @app.post("/v1/reranking", include_in_schema=False)
    @app.post("/reranking", include_in_schema=False)
    async def rerank(body: dict) -> Any:
        from minfer.errors import MinferError
        from minfer.runtime.embed import pair_ids, ranked

        engine, head, query, docs, top_n, ret = check_rerank(body)
        n_ctx = int(engine.n_ctx)

        def tokenize() -> list[list[int]]:
            return [pair_ids(engine.tokenizer, head, query, d) for d in docs]

        try:
            ids_list = await run_in_threadpool(tokenize)
        except MinferError as e:
            raise bad(str(e), "documents") from e
        for i, ids in enumerate(ids_list):
            if len(ids) > n_ctx:
                raise APIError(400, f"documents[{i}]: the query and this document are {len(ids)} tokens, more than "
                               f"this model's context of {n_ctx} tokens; shorten them or start the server with a "
                               "larger --ctx", code="context_length_exceeded", param="documents")
        item = await run_job(EmbedRequest(ids_list, "rank", -1, None), "documents", "rerank")
        n_tokens = [len(x) for x in ids_list]
        result = ranked([float(v[0]) for v in item.vectors], n_tokens, top_n)
        n = sum(n_tokens)
        state.metrics.prompt_tokens.inc(n)
        results = [{"index": i, "relevance_score": sc, **({"document": {"text": docs[i]}} if ret else {})}
                   for i, sc in result.ranking]
        return {"model": state.served_name, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                "results": results}


def _inputs(x: Any, bad) -> list:
    """`input` as a list of items, each a str or a list of token ids."""
    def ids(v) -> bool:
        return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

    if isinstance(x, str):
        items = [x]
    elif isinstance(x, list) and x and ids(x):
        items = [x]
    elif isinstance(x, list) and x and all(isinstance(v, str) or (ids(v) and v) for v in x):
        items = list(x)
    else:
        raise bad("input: expected a string, a list of strings, a list of token ids, or a list of such lists "
                  "(none empty)", "input")
    if len(items) > MAX_INPUTS:
        raise bad(f"input: {len(items)} inputs, more than the {MAX_INPUTS} one request takes", "input")
    return items


def _encoded(v: list[float], fmt: str) -> Any:
    if fmt == "float":
        return v
    from minfer.runtime.embed import embedding_bytes

    return base64.b64encode(embedding_bytes(v)).decode("ascii")
