"""POST /tokenize and /detokenize: the served model's tokenizer over HTTP, in the request and response shapes of
vLLM's and llama.cpp's servers (a client written for either works unchanged).

/tokenize takes one of
- `prompt` (vLLM) or `content` (llama.cpp's server): a text, tokenized as /v1/completions tokenizes a text prompt
  (control-token texts in it are tokens). BOS/EOS as the vocab adds them (add_bos_token / add_eos_token) or none:
  vLLM's `add_special_tokens` (default true) or llama.cpp's `add_special` (default false), each default that
  server's own;
- `messages` (vLLM's chat form): the ids /v1/chat/completions would run for the same `messages`, `tools`,
  `tool_choice`, `add_generation_prompt`, `continue_final_message` and `add_special_tokens`: the chat endpoint's
  own rendering (server/tools.py plan_chat), with its defaults and its 400s.
It answers vLLM's fields, `{"count", "max_model_len", "tokens", "token_strs"}`: `token_strs`, the vocabulary's
strings of the ids, with vLLM's `return_token_strs: true` (null otherwise). With llama.cpp's `with_pieces: true`,
`tokens` is llama.cpp's list of `{"id", "piece"}` instead: the piece is the token's text, or its bytes as a list
of numbers where they are not whole UTF-8 (llama.cpp's server does the same).

/detokenize takes `tokens` (a list of ids) and answers `{"prompt": text}` (vLLM) with the same text as `content`
(llama.cpp's server). An id outside the vocabulary is a 400 naming it.

Every other field is a 400 naming it: a field this endpoint does not read may be one the client meant to change
the answer."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

_TEXT_FIELDS = {"model", "prompt", "content", "add_special_tokens", "add_special", "with_pieces", "return_token_strs"}
_CHAT_FIELDS = {"model", "messages", "tools", "tool_choice", "add_generation_prompt", "continue_final_message",
                "add_special_tokens", "with_pieces", "return_token_strs"}


def add_token_routes(app: FastAPI, state: Any) -> None:
    """POST /tokenize and /detokenize on `app` (server/app.py's create_app; `state` its ServerState)."""
    from minfer.server.app import APIError

    def bool_field(body: dict, name: str, default: bool) -> bool:
        v = body.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise APIError(400, f"{name}: expected true or false, got {v!r}", code="invalid_value", param=name)
        return v

    def common(body: Any, fields: set) -> Any:
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object", code="invalid_value")
        engine = state.require_engine()
        state.check_model(body.get("model"))
        for name in body:
            if name not in fields:
                raise APIError(400, f"{name}: not a field of this request (it takes {', '.join(sorted(fields))})",
                               code="unsupported_value", param=name)
        return engine

    def ids_answer(tok: Any, ids: list[int], body: dict, n_ctx: int) -> dict:
        if bool_field(body, "with_pieces", False):
            tokens: list = []
            for i in ids:
                b = tok.piece_bytes(i)
                try:
                    piece: Any = b.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(b)
                tokens.append({"id": i, "piece": piece})
        else:
            tokens = list(ids)
        strs = [tok.token_text(i) for i in ids] if bool_field(body, "return_token_strs", False) else None
        return {"count": len(ids), "max_model_len": n_ctx, "tokens": tokens, "token_strs": strs}

    @app.post("/tokenize")
    async def tokenize(body: dict) -> Any:
        from minfer.errors import MinferError
        from minfer.server.prompting import encode_prompt

        chat = isinstance(body, dict) and "messages" in body
        engine = common(body, _CHAT_FIELDS if chat else _TEXT_FIELDS)
        tok = engine.tokenizer
        n_ctx = min(int(engine.n_ctx), state.seq_limit or int(engine.n_ctx))
        if chat:
            return ids_answer(tok, await _chat_ids(state, tok, body), body, n_ctx)
        given = [k for k in ("prompt", "content") if body.get(k) is not None]
        if len(given) != 1:
            raise APIError(400, "give the text as exactly one of `prompt` (vLLM) or `content` (llama.cpp's server), "
                           "or the chat as `messages`", code="invalid_value", param="prompt")
        field = given[0]
        text = body[field]
        if not isinstance(text, str):
            raise APIError(400, f"{field}: expected a string", code="invalid_value", param=field)
        if "add_special_tokens" in body and "add_special" in body:
            raise APIError(400, "add_special_tokens (vLLM) and add_special (llama.cpp's server) are the same switch: "
                           "give one", code="invalid_value", param="add_special")
        add = (bool_field(body, "add_special", False) if "add_special" in body
               else bool_field(body, "add_special_tokens", field == "prompt"))
        try:
            # true: the vocab's own BOS / EOS rule (llama_tokenize's add_special, an HF tokenizer's
            # add_special_tokens), as /v1/completions reads its text prompts; false: none
            ids = await run_in_threadpool(encode_prompt, tok, text, None if add else False)
        except MinferError as e:
            raise APIError(400, f"{field}: {e}", code="invalid_value", param=field) from e
        return ids_answer(tok, ids, body, n_ctx)

    @app.post("/detokenize")
    async def detokenize(body: dict) -> Any:
        engine = common(body, {"model", "tokens"})
        tok = engine.tokenizer
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise APIError(400, "tokens: expected a list of token ids", code="invalid_value", param="tokens")
        n_vocab = int(tok.n_vocab)
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise APIError(400, f"tokens: token id {bad[0]} is outside the vocabulary [0, {n_vocab})",
                           code="invalid_value", param="tokens")
        text = tok.decode(ids)
        return {"prompt": text, "content": text}


async def _chat_ids(state: Any, tok: Any, body: dict) -> list[int]:
    """The prompt ids of /v1/chat/completions for the chat fields of `body`."""
    from minfer.server.app import APIError, chat_plan
    from minfer.server.schemas import ChatCompletionRequest

    chat = {k: v for k, v in body.items() if k not in ("with_pieces", "return_token_strs")}
    try:
        req = ChatCompletionRequest.model_validate(chat)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "messages"
        raise APIError(400, f"{where}: {err.get('msg', 'invalid')}", code="invalid_value", param=where) from e
    return list((await chat_plan(state, tok, req)).prompt_ids)
