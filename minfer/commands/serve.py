"""`minfer serve`: an OpenAI-compatible HTTP server for one model."""

from __future__ import annotations

import argparse
import os

from minfer.commands.common import add_device_arg, add_model_arg

HELP = "serve a model over an OpenAI-compatible HTTP API (chat, completions, streaming)"
DESCRIPTION = """\
Serve one model over HTTP with OpenAI's API, so OpenAI clients and tools can use it:

  POST /v1/chat/completions   chat (messages rendered by the model's own chat template)
  POST /v1/completions        plain text completion
  GET  /v1/models             the served model (its id is what clients send as `model`)
  GET  /health                503 while the model loads, then 200 {"status": "ok"}
  GET  /metrics               Prometheus metrics (requests, tokens, tok/s histograms)

Streaming (`"stream": true`) sends server-sent events in OpenAI's chunk format. One request
generates at a time; the others wait in a first-in first-out queue. A client that disconnects
mid-stream stops its generation. The socket opens at once and the model loads in the
background, so poll /health before sending work.

Requests take OpenAI's fields plus top_k, min_p and repetition_penalty. Sampling fields a
request leaves out keep minfer's defaults (those of `minfer run`: temperature 0.8, top_k 40,
top_p 0.95, min_p 0.05); send "temperature": 0 for greedy, repeatable answers. Without
max_tokens an answer runs until the model ends its turn or the context is full.

Example:
  minfer serve -m smollm2-135m-instruct --port 8080
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8080/v1', api_key='x'); \\
print(c.chat.completions.create(model='smollm2-135m-instruct', \\
messages=[{'role': 'user', 'content': 'Hi!'}]).choices[0].message.content)"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    add_device_arg(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 exposes the server to the network -- set --api-key then)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument("-c", "--ctx", type=int, default=None,
                   help="context size in tokens, shared by prompt and answer (default: the model's "
                   "training context, at most 4096); a longer prompt gets a 400 error")
    p.add_argument("--api-key", default=os.environ.get("MINFER_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every endpoint but /health "
                   "(default: $MINFER_API_KEY; no auth when unset)")
    p.add_argument("--max-body", type=int, default=None, metavar="BYTES",
                   help="largest request body accepted, in bytes; larger ones get 413 (default 8 MiB)")
    p.add_argument("--served-name", default=None, metavar="NAME",
                   help="the model id in /v1/models and in the `model` field of requests "
                   "(default: the catalog name, or the file name without .gguf)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log verbosity (default info)")


def served_name_for(model_arg: str, path) -> str:
    """The catalog name when -m was one, else the file's stem."""
    from pathlib import Path

    p = Path(model_arg)
    return p.stem if (p.suffix == ".gguf" or os.sep in model_arg) else model_arg


def main(args: argparse.Namespace) -> int:
    import socket

    import uvicorn

    from minfer.catalog import resolve_model
    from minfer.commands.common import resolve_device
    from minfer.errors import MinferError
    from minfer.server import DEFAULT_MAX_BODY, create_app

    if args.ctx is not None and args.ctx < 1:
        raise MinferError(f"--ctx {args.ctx}: expected a positive number of tokens")
    if args.max_body is not None and args.max_body < 1024:
        raise MinferError(f"--max-body {args.max_body}: expected at least 1024 bytes")
    if not 0 <= args.port <= 65535:
        raise MinferError(f"--port {args.port}: expected 0..65535")
    path = resolve_model(args.model)  # pulls a catalog model first; fails fast on a bad path
    device = resolve_device(args.device)
    name = args.served_name or served_name_for(args.model, path)

    def load():
        from minfer.runtime.engine import Engine

        return Engine.load(str(path), device=device, ctx=args.ctx)

    # bind before starting uvicorn, so a port in use is a clear error rather than a log line
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sock.close()
        raise MinferError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e

    failure: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failed(exc: BaseException) -> None:
        # a server that can never become ready should exit with the reason, not idle at 503
        failure.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(load, served_name=name, api_key=args.api_key,
                     max_body=args.max_body or DEFAULT_MAX_BODY, on_load_failed=on_load_failed)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    print(f"minfer: serving {path.name} as `{name}` on http://{host}:{port}/v1 ({device}); "
          "the model loads in the background -- GET /health says when it is ready", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully on Ctrl-C, then re-raises the signal: a normal stop
        pass
    if failure:
        raise MinferError(f"loading {path} failed: {failure[0]}")
    print("minfer: server stopped", flush=True)
    return 0
