"""Pure-ASGI middlewares of the server: metrics, bearer auth, request body limit; and the
API's route class, which parses a POST body first (json_route_class: BodyNotJSON).

Pure ASGI rather than Starlette's BaseHTTPMiddleware: that one wraps streaming responses in
its own task and hides client disconnects from the endpoint, which the server needs to see to
stop a generation whose client went away.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from minfer.server.metrics import ServerMetrics

# endpoint label of the request counter: the known routes, everything else lumped together so
# that a scanner probing random paths cannot grow the metric without bound
_ENDPOINTS = {
    "/v1/chat/completions": "/v1/chat/completions", "/chat/completions": "/v1/chat/completions",
    "/v1/completions": "/v1/completions", "/completions": "/v1/completions",
    "/v1/models": "/v1/models", "/models": "/v1/models",
    "/health": "/health", "/metrics": "/metrics", "/tokenize": "/tokenize", "/detokenize": "/detokenize",
    "/v1/embeddings": "/v1/embeddings", "/embeddings": "/v1/embeddings",
    "/v1/rerank": "/v1/rerank", "/rerank": "/v1/rerank", "/v1/reranking": "/v1/rerank", "/reranking": "/v1/rerank",
}
GENERATION_ENDPOINTS = {"/v1/chat/completions", "/v1/completions"}


def error_payload(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


async def send_json(send: Any, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode()), *headers]})
    await send({"type": "http.response.body", "body": raw})


def endpoint_label(path: str) -> str:
    path = path.rstrip("/") or "/"
    if path.startswith(("/v1/models/", "/models/")):
        return "/v1/models/{id}"   # the route's template, not the id: one label whatever clients send
    return _ENDPOINTS.get(path, "other")


class MetricsMiddleware:
    """Counts every answered request by endpoint and status; tracks generation requests in flight."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = endpoint_label(scope["path"])
        # an app that raises before answering gives the client a 500; one that returns without
        # answering saw its client leave (e.g. mid-body): 499, as the app labels such a request,
        # never a server error on a dashboard
        status: dict = {"code": None}

        async def send_and_note(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        tracked = endpoint in GENERATION_ENDPOINTS
        if tracked:
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_note)
        except Exception:  # not CancelledError: a task cancelled under a gone client stays 499
            if status["code"] is None:
                status["code"] = 500
            raise
        finally:
            if tracked:
                self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint=endpoint, status=str(status["code"] or 499)).inc()


class AuthMiddleware:
    """`Authorization: Bearer KEY` on every path except /health (load balancers probe it bare)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") == "/health":
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
        # constant-time comparison: the key must not leak through response timing
        if given and hmac.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        msg = ("invalid API key in the Authorization header" if given else
               "this server needs an API key: send the header `Authorization: Bearer KEY`")
        await send_json(send, 401, error_payload(msg, "invalid_request_error", "invalid_api_key"),
                        headers=[(b"www-authenticate", b"Bearer")])


class BodyLimitMiddleware:
    """Answers 413 to a request body over `max_body` bytes, before any of it is parsed.

    The declared Content-Length is checked first; a chunked body (no length) is counted as it
    arrives. The body is buffered (it is at most max_body bytes) and replayed to the app, so the
    app never sees a partial body.
    """

    def __init__(self, app: Any, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_body:
                    return await self._too_large(send, declared)
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect: nobody to answer
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_body:
                return await self._too_large(send, None)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later calls wait for http.disconnect, as the app expects

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any, declared: int | None) -> None:
        size = f"{declared} bytes" if declared is not None else "more than that"
        await send_json(send, 413, error_payload(
            f"request body too large: {size}; this server accepts at most {self.max_body} bytes "
            "(minfer serve --max-body)", "invalid_request_error", "request_too_large"))


class JSONBodyMiddleware:
    """POST bodies are JSON whatever their Content-Type says (llama-server reads them so, and
    curl -d sends application/x-www-form-urlencoded): the header is rewritten to
    application/json before FastAPI parses the body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class BodyNotJSON(Exception):
    """A POST body that is not JSON text: answered 400 `invalid_json` (app.py), naming why."""

    def __init__(self, why: BaseException) -> None:
        if isinstance(why, RecursionError):
            reason = "its arrays or objects are nested too deeply"
        elif isinstance(why, json.JSONDecodeError):
            reason = f"{why.msg}: line {why.lineno} column {why.colno} (char {why.pos})"
        else:
            reason = f"{type(why).__name__}: {why}"
        super().__init__(f"invalid request: the body is not valid JSON ({reason})")


def json_route_class() -> type:
    """FastAPI's route class for the API: a POST body is parsed here, before FastAPI reads it,
    and a failure raises BodyNotJSON by the decoder's own exception types (json.JSONDecodeError,
    UnicodeDecodeError for bytes that are not UTF-8/16/32 text, RecursionError for nesting) --
    FastAPI would answer the last two with a bare HTTPException(400) chained to the error. The
    parsed value is handed to FastAPI in Starlette's Request cache, so the body is parsed once
    (with another Starlette, FastAPI would parse it again: the same value)."""
    from fastapi.routing import APIRoute

    class JSONRoute(APIRoute):
        def get_route_handler(self) -> Any:
            handler = super().get_route_handler()

            async def parse_first(request: Any) -> Any:
                if request.method == "POST":
                    body = await request.body()
                    if body:
                        try:
                            request._json = json.loads(body)
                        except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError
                            raise BodyNotJSON(e) from e
                return await handler(request)

            return parse_first

    return JSONRoute
