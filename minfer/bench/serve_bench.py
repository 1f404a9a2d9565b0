"""An HTTP serving benchmark of `minfer serve`, in the manner of vLLM's benchmark_serving.

    python -m minfer.bench.serve_bench --url http://127.0.0.1:8080 --clients 1,8,32,128
    python -m minfer.bench.serve_bench --launch -m /tmp/q7.gguf --device cuda --clients 1,8,32,128 --out r.json
    python -m minfer.bench.serve_bench --launch -m /tmp/q7.gguf --device cuda --token-budget 1024 --out b1024.json

The record's `server` says what the server ran with (slots, token budget, context, from its
/v1/models), so runs at two --token-budget values can be compared: a larger budget should lower
the time to first token of long prompts and raise the inter-token latency p99 of the answers
decoding beside them (measure it: A B A B, one server per run).

For each client count N: N clients each send streaming /v1/completions requests back to back
(closed loop; or `--poisson RATE`: requests arrive at RATE per second with exponential gaps,
whatever is in flight), with prompts of mixed lengths (`--prompt-lens`, random token ids, so
no prefix is shared) and `--max-tokens` each. Reported per N:
    requests/s, output tokens/s (the usage counts of the answers / wall time),
    time to first token p50/p99 (request sent -> first streamed token),
    inter-token latency p50/p99 (gaps between streamed chunks of one answer).
`--prefix` also measures prefix reuse: a long shared prefix sent once cold, then again with a
new suffix (warm): the first token's time for each.

Clients use httpx's async client in one process; the timings are wall-clock as a client sees
them (HTTP, JSON and SSE included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


async def one_request(client, url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    # logprobs 0 (the chosen token's only): the server then sends a chunk for EVERY token, also
    # one whose text is empty (an unprintable or partial-character token: most of a synthetic
    # model's random picks); without it TTFT and the gaps were those of visible text only
    # (2026-11-30 night session: 1 client "TTFT" 316 ms, no gaps at all)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "logprobs": 0, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    last = None
    gaps: list[float] = []
    n_out = 0
    n_chunks = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"ok": False, "status": r.status_code, "error": r.text[:200]}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            obj = json.loads(line[6:])
            if obj.get("usage"):
                n_out = obj["usage"]["completion_tokens"]
            ch = obj.get("choices") or []
            # a chunk with a choice is a token's arrival, even when its text is '' (a byte token
            # whose character is not complete yet): the first one is the time to first token.
            # The final chunk (finish_reason, no token) is not one.
            if ch and ch[0].get("logprobs") and ch[0]["logprobs"].get("tokens") is not None \
                    or (ch and ch[0].get("text") and not ch[0].get("finish_reason")):
                n_chunks += 1
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    end = time.perf_counter()
    return {"ok": True, "ttft": (first - t0) if first else None, "gaps": gaps, "n_out": n_out, "n_chunks": n_chunks,
            "latency": end - t0, "n_in": len(prompt)}


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(n)]


async def run_level(url: str, model: str, clients: int, n_requests: int, prompt_lens: list[int], max_tokens: int,
                    vocab: int, seed: int, poisson: float | None) -> dict:
    import httpx

    rng = random.Random(seed * 1000 + clients)
    prompts = [_prompt(rng, rng.choice(prompt_lens), vocab) for _ in range(n_requests)]
    results: list[dict] = []
    limits = httpx.Limits(max_connections=max(clients, 1) + 8, max_keepalive_connections=max(clients, 1) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
        t0 = time.perf_counter()
        if poisson:
            tasks = []
            for p in prompts:
                tasks.append(asyncio.create_task(one_request(client, url, model, p, max_tokens)))
                await asyncio.sleep(rng.expovariate(poisson))
            results = list(await asyncio.gather(*tasks))
        else:
            queue = list(prompts)

            async def worker():
                while queue:
                    p = queue.pop()
                    results.append(await one_request(client, url, model, p, max_tokens))

            await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    n_out = sum(r["n_out"] for r in ok)
    return {"clients": clients, "mode": f"poisson {poisson}/s" if poisson else "closed loop",
            "requests": len(results), "failed": len(results) - len(ok), "wall_s": wall,
            # what the server said to the first refused request (e.g. a token id past the vocabulary:
            # --vocab), so a level of failures says why
            "first_error": next(({"status": r["status"], "error": r["error"]} for r in results if not r["ok"]), None),
            "requests_per_s": len(ok) / wall, "output_tps": n_out / wall,
            "input_tokens": sum(r["n_in"] for r in ok), "output_tokens": n_out,
            "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
            "itl_p50_ms": _ms(_pct(gaps, 50)), "itl_p99_ms": _ms(_pct(gaps, 99)),
            "latency_mean_s": statistics.mean(r["latency"] for r in ok) if ok else None,
            # every generated token arrived as its own timed chunk (else TTFT/ITL are not per token)
            "chunk_per_token": all(r["n_chunks"] == r["n_out"] for r in ok)}


def _ms(x):
    return None if x is None else x * 1000


async def prefix_reuse(url: str, model: str, prefix_len: int, vocab: int, seed: int, reps: int = 3) -> dict:
    """TTFT of a long prompt whose prefix is new (cold) vs already cached (warm: same prefix,
    new 16-token suffix), one request at a time."""
    import httpx

    rng = random.Random(seed + 7)
    cold, warm, errors = [], [], []
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0)) as client:
        for _ in range(reps):
            prefix = _prompt(rng, prefix_len, vocab)
            for out in (cold, warm):
                r = await one_request(client, url, model, prefix + _prompt(rng, 16, vocab), 4)
                if r.get("ttft") is None:       # refused or no token streamed: say so, do not guess
                    errors.append({k: r.get(k) for k in ("status", "error", "n_out")})
                else:
                    out.append(r["ttft"])

    def med(xs):
        return statistics.median(xs) * 1000 if xs else None

    return {"prefix_tokens": prefix_len, "ttft_cold_ms": [c * 1000 for c in cold],
            "ttft_warm_ms": [w * 1000 for w in warm], "ttft_cold_median_ms": med(cold),
            "ttft_warm_median_ms": med(warm), "errors": errors}


def table(levels: list[dict]) -> str:
    head = "| clients | mode | requests | req/s | output t/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
    rows = [head, "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in levels:
        rows.append(f"| {r['clients']} | {r['mode']} | {r['requests'] - r['failed']}/{r['requests']} | "
                    f"{f(r['requests_per_s'], 2)} | {f(r['output_tps'])} | {f(r['ttft_p50_ms'])} | "
                    f"{f(r['ttft_p99_ms'])} | {f(r['itl_p50_ms'])} | {f(r['itl_p99_ms'])} |")
    return "\n".join(rows)


def _wait_ready(url: str, proc, limit_s: float = 900, unreachable_s: float = 10) -> None:
    """Until GET /health answers 200. Without a launched server, nothing listening at `url` for
    `unreachable_s` is an error at once (it was a silent 15-minute wait); a server that answers
    (503 while it loads) is waited for up to `limit_s`."""
    import httpx

    t0 = time.monotonic()
    answered = False
    while time.monotonic() < t0 + limit_s:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"serve_bench: the server exited with code {proc.returncode}")
        try:
            status = httpx.get(url + "/health", timeout=5).status_code
            answered = True
            if status == 200:
                return
        except httpx.HTTPError:
            if proc is None and not answered and time.monotonic() > t0 + unreachable_s:
                raise SystemExit(f"serve_bench: nothing answers at {url}/health; start `minfer serve` there "
                                 "first, or add --launch -m MODEL") from None
        time.sleep(0.5)
    raise SystemExit(f"serve_bench: the server at {url} was not ready after {limit_s:.0f} s")


def _too_long(prompt: int, max_tokens: int, n_ctx: int) -> str | None:
    """Why the longest request does not fit a context of n_ctx, or None. The server stores the
    prompt and the answer but its last token (server/app.py `room`): prompt + max_tokens - 1."""
    if prompt + max_tokens - 1 <= n_ctx:
        return None
    return (f"the longest prompt ({prompt} tokens, --prompt-lens) with --max-tokens {max_tokens} needs a context of "
            f"{prompt + max_tokens - 1} but the server's is {n_ctx}: such answers would be cut short (or the "
            "prompt refused) and the table would not measure what it says; give shorter prompts or a larger --ctx")


def _served_id(url: str) -> str:
    import httpx

    try:
        return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    except Exception as e:   # noqa: BLE001 -- say what to do instead of a traceback
        raise SystemExit(f"serve_bench: cannot read the model name from {url}/v1/models ({e}); "
                         "give --served-name") from None


def _check_fits(url: str, prompt: int, max_tokens: int) -> None:
    """The longest request within the server's context (/v1/models meta.n_ctx)."""
    import httpx

    try:
        n_ctx = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["meta"]["n_ctx"]
    except Exception:   # noqa: BLE001 -- another server's card: nothing to check against
        return
    why = _too_long(prompt, max_tokens, int(n_ctx))
    if why:
        raise SystemExit(f"serve_bench: {why}")


def _positive_ints(s: str) -> list[int]:
    try:
        xs = [int(x) for x in s.split(",")]
    except ValueError:
        xs = []
    if not xs or min(xs) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: expected comma-separated integers >= 1, e.g. 1,8,32")
    return xs


def server_command(a: argparse.Namespace) -> list[str]:
    """The `minfer serve` command line --launch runs."""
    cmd = [sys.executable, "-m", "minfer", "serve", "-m", a.model, "--device", a.device, "--port",
           a.url.rsplit(":", 1)[1], "--ctx", str(a.ctx), "--served-name", a.served_name, "--log-level", "warning"]
    for flag, value in (("--parallel", a.parallel), ("--token-budget", a.token_budget), ("--kv-memory", a.kv_memory)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def server_settings(model_card: dict, a: argparse.Namespace) -> dict:
    """What the record says the server ran with: the launched flags, and what the server reports
    (its /v1/models meta: the budget and slots it actually uses, also for a server at --url)."""
    meta = (model_card.get("data") or [{}])[0].get("meta") or {}
    return {"launched": a.launch, "parallel_flag": a.parallel, "token_budget_flag": a.token_budget,
            "kv_memory_flag": a.kv_memory, "slots": meta.get("max_concurrent_requests"),
            "token_budget": meta.get("token_budget"), "n_ctx": meta.get("n_ctx")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--launch", action="store_true", help="start `minfer serve` (-m, --device, ...) first")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parallel", type=int, default=None, help="the server's --parallel (with --launch)")
    ap.add_argument("--ctx", type=int, default=4096, help="the server's --ctx (with --launch)")
    ap.add_argument("--token-budget", type=int, default=None, metavar="N",
                    help="the server's --token-budget (with --launch): tokens per batch-engine step; larger "
                    "lowers time to first token, raises inter-token latency p99 (A/B it: one run per value)")
    ap.add_argument("--kv-memory", default=None, metavar="SIZE", help="the server's --kv-memory (with --launch)")
    ap.add_argument("--served-name", default=None, metavar="NAME",
                    help="the model name requests send (default: 'bench' for a launched server, else the id "
                    "the server at --url lists in /v1/models)")
    ap.add_argument("--clients", type=_positive_ints, default=[1, 8, 32, 128], metavar="N[,N..]")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: 2 x clients, >= 8)")
    ap.add_argument("--prompt-lens", type=_positive_ints, default=[128, 512, 1024], metavar="N[,N..]",
                    help="prompt lengths drawn uniformly")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--poisson", type=float, default=None, help="arrival rate (requests/s) instead of closed loop")
    ap.add_argument("--vocab", type=int, default=30000, help="prompt ids are drawn from [100, VOCAB)")
    ap.add_argument("--prefix", type=int, default=0, help="also measure prefix reuse with a prefix of this many tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the JSON record here")
    a = ap.parse_args(argv)
    if a.max_tokens < 1:
        ap.error(f"--max-tokens {a.max_tokens}: expected 1 or more")
    if a.launch and _too_long(max(a.prompt_lens), a.max_tokens, a.ctx):
        ap.error(_too_long(max(a.prompt_lens), a.max_tokens, a.ctx))
    if a.launch and not a.model:
        ap.error("--launch starts `minfer serve -m MODEL`: give -m")
    if not a.launch and (a.token_budget is not None or a.kv_memory is not None or a.parallel is not None):
        ap.error("--parallel, --token-budget and --kv-memory are the launched server's flags: add --launch "
                 "(a server at --url keeps the ones it was started with; the record reads them from /v1/models)")
    proc = None
    if a.launch:
        a.served_name = a.served_name or "bench"
        proc = subprocess.Popen(server_command(a))
    try:
        _wait_ready(a.url, proc)
        if a.served_name is None:
            # a server at --url serves its own name (the catalog name, the file's stem): with a
            # fixed 'bench' every request was a 404 model_not_found
            a.served_name = _served_id(a.url)
        lens = a.prompt_lens
        _check_fits(a.url, max(lens), a.max_tokens)
        levels = []
        for c in a.clients:
            n = a.requests or max(8, 2 * c)
            r = asyncio.run(run_level(a.url, a.served_name, c, n, lens, a.max_tokens, a.vocab, a.seed, a.poisson))
            levels.append(r)
            print(f"  {c} clients: {r['requests_per_s']:.2f} req/s, {r['output_tps']:.0f} output t/s, "
                  f"TTFT p50 {r['ttft_p50_ms'] or 0:.0f} ms" + (f"; {r['failed']} of {r['requests']} failed, the "
                  f"first with {r['first_error']['status']}: {r['first_error']['error']}" if r["failed"] else ""),
                  file=sys.stderr, flush=True)
        from datetime import datetime, timezone

        import httpx

        from minfer.bench.machine import git_commit, machine_info

        try:
            card = httpx.get(a.url + "/v1/models", timeout=10).json()
        except Exception:   # noqa: BLE001 -- the numbers are kept; the record says the card is missing
            card = {}
        record = {"kind": "serve", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "commit": git_commit(), "machine": machine_info(a.device), "model": a.model,
                  "url": a.url, "max_tokens": a.max_tokens, "prompt_lens": lens,
                  "server": server_settings(card, a), "levels": levels}
        if a.prefix:
            record["prefix_reuse"] = asyncio.run(prefix_reuse(a.url, a.served_name, a.prefix, a.vocab, a.seed))
        try:
            record["server_metrics"] = httpx.get(a.url + "/metrics", timeout=10).text
            record["server_model"] = card
        except Exception:
            pass
        if a.out:
            with open(a.out, "w") as f:
                json.dump(record, f, indent=1)
        srv = record["server"]
        print(f"server: {srv['slots']} slots, token budget {srv['token_budget'] or 'n/a (one at a time)'}, "
              f"context {srv['n_ctx']}")
        print(table(levels))
        if a.prefix:
            p = record["prefix_reuse"]
            fmt = lambda v: "n/a" if v is None else f"{v:.1f} ms"   # noqa: E731
            print(f"prefix reuse ({p['prefix_tokens']} tokens): TTFT cold {fmt(p['ttft_cold_median_ms'])}, "
                  f"warm {fmt(p['ttft_warm_median_ms'])}" + (f"; errors {p['errors']}" if p["errors"] else ""))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
