"""`minfer serve`: an OpenAI-compatible HTTP server for one model."""

from __future__ import annotations

import argparse
import os

HELP = "serve a model over an OpenAI-compatible HTTP API (chat, completions, streaming)"
DESCRIPTION = """\
Serve one model over HTTP with OpenAI's API, so OpenAI clients and tools can use it:

  POST /v1/chat/completions   chat (messages rendered by the model's own chat template)
  POST /v1/completions        plain text completion
  GET  /v1/models             the served model (its id is what clients send as `model`)
  POST /v1/embeddings         embedding vectors of texts (pooled as the file says, or --pooling)
  POST /v1/rerank             a reranker's relevance scores of documents for a query (also /rerank, /v1/reranking)
  GET  /health                503 while the model loads, then 200 {"status": "ok", "slots": N}
  GET  /metrics               Prometheus metrics (requests, tokens, tok/s, KV blocks, latencies)

Streaming (`"stream": true`) sends server-sent events in OpenAI's chunk format. With -np N
(the default on CUDA) N requests generate together (continuous batching over a paged KV cache,
sized by --kv-memory; --token-budget trades time to first token against inter-token latency);
on the CPU by default one request generates at a time and the others wait in a first-in
first-out queue. A client that disconnects mid-stream stops its generation. The socket opens
at once and the model loads in the background, so poll /health before sending work.

Requests take OpenAI's fields plus top_k, min_p and repetition_penalty. Sampling fields a
request leaves out keep minfer's defaults (those of `minfer run`: temperature 0.8, top_k 40,
top_p 0.95, min_p 0.05); send "temperature": 0 for greedy answers. On the CPU's default
int4/int8 matrices a prompt's tokens computed in one prefill and those after a prefix still in
the KV cache round differently (bfloat16), so a repeated request can take another token at a
near-tie; MINFER_CPU_QUANT=0 (float32) repeats exactly. Without max_tokens an answer runs until
the model ends its turn or the context is full.

Example:
  minfer serve -m smollm2-135m-instruct --port 8080
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8080/v1', api_key='x'); \\
print(c.chat.completions.create(model='smollm2-135m-instruct', \\
messages=[{'role': 'user', 'content': 'Hi!'}]).choices[0].message.content)"
"""


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent

    return [engine_parent()]   # -m, --device, -c/--ctx-size, -t/--threads, -ngl


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 exposes the server to the network -- set --api-key then)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument("--api-key", default=os.environ.get("MINFER_API_KEY"), metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every endpoint but /health "
                   "(default: $MINFER_API_KEY; no auth when unset)")
    p.add_argument("--max-body", type=int, default=None, metavar="BYTES",
                   help="largest request body accepted, in bytes; larger ones get 413 (default 8 MiB)")
    p.add_argument("--served-name", default=None, metavar="NAME",
                   help="the model id in /v1/models and in the `model` field of requests "
                   "(default: the catalog name, or the file name without .gguf)")
    p.add_argument("--alias", action="append", default=[], metavar="NAME",
                   help="another model name requests may send for this model (repeatable), for "
                   "clients with a hard-coded model name")
    p.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="allow browser pages from ORIGIN (e.g. http://localhost:3000, or * for any) to "
                   "call the API (repeatable; default: no cross-origin access)")
    p.add_argument("--special-in-content", action="store_true",
                   help="let control-token text in message content (e.g. <|im_end|>) become control "
                   "tokens, as llama.cpp's CLI does; by default a client's content is plain text, so a "
                   "user cannot forge a turn of another role")
    p.add_argument("-np", "--parallel", type=int, default=None, metavar="N",
                   help="serve up to N requests at once (continuous batching over a paged KV cache); "
                   "default: on CUDA as many as the KV memory holds at a quarter context each (at most "
                   "256), on the CPU 1 (one at a time, first in first out); 0: on CUDA as many as the KV memory "
                   "holds, on the CPU 4. A --kv-memory that cannot hold one full context, or one block per "
                   "sequence, is refused before the load")
    p.add_argument("--kv-memory", type=parse_size, default=None, metavar="SIZE",
                   help="memory for the paged KV cache with --parallel, e.g. 8G or 512M (default: on CUDA "
                   "85%% of the free memory, at most N full contexts; on the CPU N full contexts)")
    p.add_argument("--token-budget", type=int, default=None, metavar="N",
                   help="with -np N > 1: the most tokens one engine step processes, prefill chunks of new "
                   "prompts plus one token per answer being generated (default 4096 on CUDA, 512 on the CPU; "
                   "at least -np). The trade: a larger budget cuts a long prompt into fewer, bigger chunks, so "
                   "its first token comes sooner (lower time to first token), but every step that carries a "
                   "chunk takes longer for the answers decoding beside it (higher inter-token latency p99); a "
                   "smaller one the reverse")
    p.add_argument("--pooling", default=None, choices=["mean", "cls", "last"],
                   help="how POST /v1/embeddings pools a text's hidden rows into one vector: mean (their "
                   "average), cls (the first token's), last (the last token's: Qwen3-Embedding) (default: the "
                   "file's pooling_type, which embedding models' files carry; a chat model's file has none, so "
                   "/v1/embeddings answers 400 until this is given)")
    p.add_argument("--log-level", default="info", type=str.lower,
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="server log verbosity (default info; any case)")


def parse_size(s: str) -> int:
    """'8G', '512M', '1.5GiB' or a number of bytes -> bytes."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"{s!r}: expected a size such as 8G, 512M or 1073741824")
    n = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))
    if n < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: expected a size above 0, such as 8G or 512M")
    return n


def served_name_for(model_arg: str, path) -> str:
    """The catalog name when -m was one, else the file's stem."""
    from pathlib import Path

    p = Path(model_arg)
    return p.stem if (p.suffix == ".gguf" or os.sep in model_arg) else model_arg


def main(args: argparse.Namespace) -> int:
    import re
    import socket

    import uvicorn

    from minfer.catalog import resolve_model
    from minfer.commands.common import resolve_device
    from minfer.errors import MinferError
    from minfer.server import DEFAULT_MAX_BODY, create_app

    if args.max_body is not None and args.max_body < 1024:
        raise MinferError(f"--max-body {args.max_body}: expected at least 1024 bytes")
    if not args.host.strip():
        # the socket takes "" as every interface: `--host "$HOST"` with HOST unset exposed the server
        raise MinferError("--host is empty: give the address to listen on, e.g. 127.0.0.1 (this machine "
                          "only, the default) or 0.0.0.0 (every interface)")
    if "://" in args.host or "/" in args.host:
        raise MinferError(f"--host {args.host}: expected an address or host name to listen on (e.g. 127.0.0.1, "
                          "0.0.0.0 or localhost), not a URL; the port goes in --port")
    if not 0 <= args.port <= 65535:
        raise MinferError(f"--port {args.port}: expected 0..65535")
    if args.parallel is not None and args.parallel < 0:
        raise MinferError(f"-np/--parallel {args.parallel}: expected the number of requests served "
                          "at once, 1 or more (0: as many as the KV memory holds)")
    if args.token_budget is not None and args.token_budget < 1:
        raise MinferError(f"--token-budget {args.token_budget}: expected the most tokens one step "
                          "processes, 1 or more (and at least -np)")
    for origin in args.cors:
        # a browser sends Origin as scheme://host[:port] (RFC 6454), never with a path or a slash
        # at the end: "localhost:3000" or "http://a.com/" would never match, and say nothing
        if origin != "*" and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+", origin):
            raise MinferError(f"--cors {origin!r}: expected an origin as a browser sends it, "
                              "scheme://host[:port] with no path (e.g. http://localhost:3000), or *")
    for flag, value in [("--served-name", args.served_name)] + [("--alias", a) for a in args.alias]:
        if value is not None and not value.strip():
            raise MinferError(f"{flag} is empty: clients send this name as `model`; give a name")
    if args.api_key is not None and not args.api_key.strip():
        raise MinferError("--api-key is empty (or $MINFER_API_KEY is set but empty): give a key, or "
                          "leave both unset to serve without authentication")
    from minfer.commands.common import apply_threads, device_from_args, warn
    from minfer.commands.preflight import check_batch, check_ctx, check_runnable
    from minfer.gguf_file import GGUFFile
    from minfer.models import ARCHITECTURES

    device = resolve_device(device_from_args(args))
    check_runnable(args.model)        # before a download: the catalog knows the architecture
    path = resolve_model(args.model)  # pulls a catalog model first; fails fast on a bad path
    gf = GGUFFile(path)
    n_ctx = check_ctx(gf, args.ctx, device, warn)   # a context that cannot fit: one line, now
    if not getattr(ARCHITECTURES.get(gf.architecture), "causal", True):   # bert
        ranks = "cls.output.weight" in gf.tensors       # a cross-encoder's classifier head (models/bert.py)
        warn(f"{path.name} is an encoder ({gf.architecture}): " + (
            "a reranker; /v1/rerank answers" if ranks else "it only embeds; /v1/embeddings answers") +
            ", the generation routes answer 400")
    elif gf.get("tokenizer.chat_template") is None:   # e.g. the catalog's gemma-3-270m
        warn(f"{path.name} has no chat template (a base model): /v1/chat/completions writes "
             "conversations in the turn format its vocabulary suggests (or ChatML), which a base model "
             "was not tuned to answer; /v1/completions continues a text")
    apply_threads(args)
    name = args.served_name or served_name_for(args.model, path)
    parallel = args.parallel if args.parallel is not None else (0 if device == "cuda" else 1)
    parallel = _one_at_a_time_if_unpaged(gf, args.parallel, parallel, warn)
    for flag, value, what in (("--kv-memory", args.kv_memory, "sizes the paged KV cache"),
                              ("--token-budget", args.token_budget, "limits each step of the batch engine")):
        if value is not None and parallel == 1:
            warn(f"{flag} {what} of -np N > 1; with one request at a time "
                 f"({'-np 1' if args.parallel == 1 else 'the default on ' + device}) it changes nothing")
    # a pool or budget the batch engine would refuse, or that cannot hold one full context: one
    # line now, not after the server has started (the engine is built by the background load)
    check_batch(gf, n_ctx, device, parallel, args.kv_memory, args.token_budget, warn)

    def load():
        import logging
        import sys

        from minfer.runtime.engine import Engine

        # the loading bar only on a terminal: redirected to a file or a journal, each redraw of it
        # was kept ("\r" and all); the load's notes then come as log lines instead
        tty = sys.stderr.isatty()
        eng = Engine.load(str(path), device=device, ctx=args.ctx, progress=tty)
        apply_threads(args)   # -t wins over the engine's MINFER_THREADS
        if not tty:
            log = logging.getLogger("minfer.server")
            quant = getattr(eng, "cpu_quant_report", None) or {}
            if quant.get("refused"):
                from minfer.runtime.cpu_calibration import refusal_note

                log.warning("%s", refusal_note(path.name, quant))
            if getattr(eng, "memory_report", None):
                log.info("loaded %s: %s", path.name, eng.memory_report)
        return eng

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

    app = create_app(load, served_name=name, aliases=args.alias, cors_origins=args.cors, api_key=args.api_key,
                     max_body=args.max_body or DEFAULT_MAX_BODY, on_load_failed=on_load_failed,
                     special_in_content=args.special_in_content,
                     parallel=parallel,
                     kv_memory=args.kv_memory, token_budget=args.token_budget, pooling=args.pooling)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5)
    # uvicorn configures its own loggers only: without a handler, the server's "model ready" line
    # (the moment the startup message tells users to wait for) was dropped at INFO
    import logging

    server_log = logging.getLogger("minfer.server")
    if not server_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("minfer: %(message)s"))
        server_log.addHandler(handler)
        server_log.propagate = False
    server_log.setLevel(args.log_level.upper())
    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            # end the generations in flight first: their requests answer 503 "the server is shutting
            # down" at once. They ran on past uvicorn's 5 s graceful timeout and were then cancelled,
            # each printing a CancelledError traceback (Ctrl-C on a busy server)
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, app.state.minfer.shutdown)
            await super().shutdown(sockets=sockets)

    server = _Server(config)
    host, port = sock.getsockname()[:2]
    import ipaddress
    import sys

    if not args.api_key and not ipaddress.ip_address(host.split("%")[0]).is_loopback:
        print(f"minfer: warning: listening on {host} (reachable from the network) without --api-key: "
              "anyone who can reach this port can use the model; set --api-key or $MINFER_API_KEY",
              file=sys.stderr, flush=True)
    print(f"minfer: serving {path.name} as `{name}` on http://{host}:{port}/v1 ({device}); "
          "the model loads in the background -- GET /health says when it is ready", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully on Ctrl-C, then re-raises the signal: a normal stop
        pass
    if failure:
        raise MinferError(f"loading {path} failed: {failure[0]}")
    loader = getattr(app.state.minfer, "_loader", None)
    if loader is not None and loader.is_alive():
        # stopped (Ctrl-C) while the model loads: the load runs in a daemon thread inside torch's
        # C++ code, and letting the interpreter finalize under it aborted the process ("terminate
        # called without an active exception", SIGABRT). Nothing is left to save: leave at once.
        print("minfer: server stopped (the model had not finished loading)", flush=True)
        sys.stderr.flush()
        os._exit(0)
    print("minfer: server stopped", flush=True)
    return 0


def _one_at_a_time_if_unpaged(gf, asked, parallel: int, warn) -> int:
    """-np for an architecture the batch engine's paged KV cache cannot run (Model.paged_kv False,
    deepseek2): 1, said once, when -np was not given; a MinferError before the load when it asked
    for more (the batch engine would refuse it only after the server had started)."""
    from minfer.errors import MinferError
    from minfer.models import ARCHITECTURES

    cls = ARCHITECTURES.get(gf.architecture)
    if cls is None or cls.paged_kv or parallel == 1:
        return parallel
    encoder = not cls.causal      # bert: nothing to batch
    if asked is not None:
        why = "it is an encoder: embeddings only, no KV cache" if encoder else \
            "its paged KV cache does not apply this model's attention"
        raise MinferError(f"-np {asked}: architecture '{gf.architecture}' cannot run in the batch engine ({why}); "
                          "give -np 1")
    warn(f"architecture '{gf.architecture}' runs one request at a time (-np 1): " +
         ("it is an encoder (embeddings only, no KV cache)" if encoder else
          "the batch engine's paged KV cache does not apply its attention"))
    return 1
