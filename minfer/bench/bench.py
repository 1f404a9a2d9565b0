"""`minfer bench`: llama-bench's tests and table for minfer, plus roofline numbers,
interleaved A/B of two switch settings (minfer.switches), and an in-run torch peer.

Conventions (llama.cpp tools/llama-bench):
- pp<N>: prefill of N random token ids into a fresh cache, logits of the last token only.
- tg<N>: N tokens decoded one at a time (forward of 1 token each), starting from an empty
  cache; the next token is random, not sampled, so EOS never stops a run.
- `@ d<D>`: the same after a D-token context is in the cache (filled before the clock starts).
- Each test runs one warm-up repetition (excluded), then -r repetitions; t/s is reported as
  the mean ± the sample standard deviation of the per-repetition tokens/second.
On CUDA the device is synchronized before each clock read.

Roofline columns (what the work needs, not what the implementation happens to do):
- pp TFLOP/s: 2 * N * (parameters of the layers' matrices) + 2 * vocab * hidden (the output
  head, last token) + causal attention 4 * layers * heads * head_dim * (N * D + N (N + 1) / 2)
  (QK^T and PV over the positions each query sees), over the layers that run softmax attention
  (a hybrid's Mamba, DeltaNet, KDA or convolution layers add none: _softmax_attention_layers); a block
  that a forward runs several times (hrm_text's stacks: Model.block_passes) counts once a pass, in FLOPs
  and in bytes read.
- tg GB/s: tensor bytes read per token -- every layer tensor, the output head (token_embd when
  tied) and one embedding row -- times tokens / s. The KV cache reads are not counted.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from minfer.errors import MinferError

FORMAT = "minfer-bench/1"


@dataclass(frozen=True)
class Test:
    kind: str    # 'pp' or 'tg'
    n: int       # tokens prefilled / generated
    depth: int   # tokens already in the cache

    @property
    def name(self) -> str:
        return f"{self.kind}{self.n}" + (f" @ d{self.depth}" if self.depth else "")


def make_tests(n_prompt: list[int], n_gen: list[int], depths: list[int]) -> list[Test]:
    """llama-bench's order: for each depth, the pp tests then the tg tests (0 = none)."""
    tests = []
    for d in depths:
        tests += [Test("pp", n, d) for n in n_prompt if n > 0]
        tests += [Test("tg", n, d) for n in n_gen if n > 0]
    if not tests:
        raise MinferError("no test to run: give -p and/or -n with a positive token count")
    return tests


# ---------------------------------------------------------------- model accounting

@dataclass
class ModelStats:
    """What the roofline columns need, from the GGUF tensor table."""
    path: str
    desc: str            # llama-bench's model column: 'qwen2 7.6B Q4_K_M'
    arch: str
    file_type: str | None
    size_bytes: int      # all tensor data
    n_params: int
    n_layers: int
    n_head: int          # the most query heads of a layer (0: no attention, e.g. Mamba)
    head_dim: int
    attn_heads: int      # query heads summed over the layers (a per-layer head_count list summed)
    layer_params: int    # elements of the blk.* 2-D matrices
    head_params: int     # output head elements (vocab * hidden)
    tg_bytes: int        # tensor bytes read per decoded token

    def pp_flops(self, n: int, depth: int) -> float:
        attn = 4 * self.attn_heads * self.head_dim * (n * depth + n * (n + 1) / 2)
        return 2.0 * n * self.layer_params + 2.0 * self.head_params + attn

    @classmethod
    def from_gguf(cls, gf) -> "ModelStats":
        t = gf.tensors
        g = gf.arch_get
        for key in ("attention.head_count", "embedding_length"):
            if g(key) is None:
                raise MinferError(f"{gf.path}: metadata '{gf.architecture}.{key}' is missing; the bench "
                                  "needs it for the model's FLOPs and bytes per token")
        if "token_embd.weight" not in t:
            raise MinferError(f"{gf.path}: tensor 'token_embd.weight' is missing")
        n_layers = int(g("block_count"))
        hc = g("attention.head_count")   # a list (one count per layer) in some GGUFs: Laguna
        heads = [int(h) for h in hc] if isinstance(hc, (list, tuple)) else [int(hc)] * n_layers
        quad = _softmax_attention_layers(t, n_layers)
        if quad is not None:             # a hybrid whose head_count is one number: its attention layers only
            heads = [h if i in quad else 0 for i, h in enumerate(heads)]
        n_head = max(heads, default=0)
        hidden = int(g("embedding_length"))
        # attention-free models (Mamba: head_count 0) have no attention FLOPs
        head_dim = int(g("attention.key_length") or (hidden // n_head if n_head else 0))
        head = t.get("output.weight") or t["token_embd.weight"]
        emb = t["token_embd.weight"]
        passes = _block_passes(gf)         # {block: passes} where a forward runs a block more than once (hrm_text)
        layer = [(_block_of(n, passes), x) for n, x in t.items() if n.startswith("blk.")]
        layer_params = sum(x.n_elements * p for p, x in layer if len(x.shape) == 2)
        norms = sum(x.n_bytes for n, x in t.items() if not n.startswith("blk.") and len(x.shape) == 1)
        tg_bytes = sum(x.n_bytes * p for p, x in layer) + head.n_bytes + norms + emb.n_bytes // emb.shape[0]
        if passes:
            heads = [h * passes.get(i, 1) for i, h in enumerate(heads)]
        n_params = gf.n_params()
        ftype = gf.file_type_name()
        desc = f"{gf.architecture} {n_params / 1e9:.1f}B {ftype or ''}".strip() if n_params >= 1e9 \
            else f"{gf.architecture} {n_params / 1e6:.0f}M {ftype or ''}".strip()
        return cls(str(gf.path), desc, gf.architecture, ftype, gf.tensor_bytes(), n_params,
                   n_layers, n_head, head_dim, sum(heads), layer_params, head.n_elements, tg_bytes)


def _block_passes(gf) -> dict:
    """The architecture's Model.block_passes for this file ({} for every block once, or an unknown architecture)."""
    from minfer.models import ARCHITECTURES

    cls = ARCHITECTURES.get(gf.architecture)
    return (cls.block_passes(gf) if cls is not None else None) or {}


def _block_of(name: str, passes: dict) -> int:
    """The passes of tensor `name`'s block (blk.N.*): passes[N], 1 where not given."""
    part = name.split(".")[1]
    return passes.get(int(part), 1) if passes and part.isdigit() else 1


def _softmax_attention_layers(tensors, n_layers: int) -> set | None:
    """The layers that run softmax attention over the context (what the attention FLOPs count), by their
    tensors: an attention output projection (`attn_output`) and either no state-space / linear-attention
    tensors (`ssm_*`: Jamba's, Nemotron-H's and Granite-hybrid's Mamba layers, Qwen3-Next's and Qwen3.5's
    DeltaNet layers, Kimi-Linear's KDA layers, which use attn_q/k/v as their projections) or a Mamba mixer
    of its own beside the attention (`ssm_in`: Falcon-H1's parallel layers). Layers without attn_output
    (LFM2's convolutions, Mamba's mixers) have none. None: every layer counts (each has attn_output and
    none a state-space tensor, or no layer has attn_output and none a state-space tensor: names this rule
    does not know)."""
    names: dict[int, set] = {}
    for name in tensors:
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
            names.setdefault(int(parts[1]), set()).add(parts[2])
    ssm = any(n.startswith("ssm_") for ns in names.values() for n in ns)
    quad = {i for i in range(n_layers) if "attn_output" in names.get(i, ())
            and ("ssm_in" in names[i] or not any(n.startswith("ssm_") for n in names[i]))}
    if not ssm and (len(quad) == n_layers or not quad):
        return None
    return quad


# ---------------------------------------------------------------- runners

class EngineRunner:
    """minfer's Engine through its public API (prefill / forward)."""
    name = "minfer"

    def __init__(self, engine):
        self.eng = engine
        self.base = engine.switches

    def configure(self, changes: dict) -> dict:
        """Switch the engine to its load-time switches with `changes` (MINFER_X=value) applied;
        returns the switches in effect as {env: value} for the record."""
        sw = self.base.with_env(changes)
        self.eng.set_switches(sw)
        return {k: changes[k] for k in changes}

    def reset(self) -> None:
        self.eng.reset()

    def prefill(self, ids: list[int], start_pos: int) -> None:
        # prefill() re-uses the cached prefix: exactly the start_pos tokens already there
        self.eng.prefill(self.eng.tokens[:start_pos] + ids)

    def decode(self, tok: int, pos: int) -> None:
        self.eng.forward([tok], pos)


class PeerRunner:
    """The torch peer, fed and timed the same way (logits copied to the host like the engine)."""
    name = "torch-bf16"

    def __init__(self, peer):
        import torch

        self.peer, self.torch = peer, torch

    def reset(self) -> None:
        pass  # positions are overwritten; attention only reads [0, start_pos + T)

    def prefill(self, ids: list[int], start_pos: int) -> None:
        self.peer.forward(self.torch.tensor(ids, dtype=self.torch.long), start_pos, last_only=True).cpu()

    def decode(self, tok: int, pos: int) -> None:
        self.peer.forward(self.torch.tensor([tok], dtype=self.torch.long), pos, last_only=True).cpu()


class Timer:
    """Wall clock that synchronizes the GPU before each read; peak memory on CUDA."""

    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda"
        self.torch = torch

    def now(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return int(self.torch.cuda.max_memory_allocated()) if self.cuda else None


def run_once(runner, test: Test, rng: np.random.Generator, vocab: int, timer: Timer) -> float:
    """One repetition of a test; seconds."""
    ctx = rng.integers(0, vocab, size=test.depth).tolist()
    ids = rng.integers(0, vocab, size=test.n).tolist()
    runner.reset()
    if test.depth:
        runner.prefill(ctx, 0)
    t0 = timer.now()
    if test.kind == "pp":
        runner.prefill(ids, test.depth)
    else:
        for j, tok in enumerate(ids):
            runner.decode(tok, test.depth + j)
    return timer.now() - t0


@dataclass
class Result:
    runner: str
    test: Test
    samples_s: list[float]
    stats: ModelStats | None   # None: no roofline columns
    peak_mem_bytes: int | None = None
    env: dict = field(default_factory=dict)

    @property
    def samples_ts(self) -> list[float]:
        return [self.test.n / s for s in self.samples_s]

    @property
    def avg_ts(self) -> float:
        return float(np.mean(self.samples_ts))

    @property
    def stdev_ts(self) -> float:
        ts = self.samples_ts
        return float(np.std(ts, ddof=1)) if len(ts) > 1 else 0.0

    @property
    def tflops(self) -> float | None:
        if self.test.kind != "pp" or self.stats is None:
            return None
        return self.stats.pp_flops(self.test.n, self.test.depth) / float(np.mean(self.samples_s)) / 1e12

    @property
    def gbps(self) -> float | None:
        if self.test.kind != "tg" or self.stats is None:
            return None
        return self.stats.tg_bytes * self.avg_ts / 1e9

    def to_json(self) -> dict:
        t = self.test
        return {"runner": self.runner, "test": t.name, "kind": t.kind,
                "n_prompt": t.n if t.kind == "pp" else 0, "n_gen": t.n if t.kind == "tg" else 0,
                "depth": t.depth, "reps": len(self.samples_s), "samples_s": self.samples_s,
                "samples_ts": self.samples_ts, "avg_ts": self.avg_ts, "stdev_ts": self.stdev_ts,
                "tflops": self.tflops, "gbps": self.gbps, "peak_mem_bytes": self.peak_mem_bytes,
                "env": self.env}


def measure(runner, test: Test, reps: int, rng, vocab: int, timer: Timer, warmup: bool = True,
            stats: ModelStats | None = None) -> Result:
    if warmup:
        run_once(runner, test, rng, vocab, timer)
    timer.reset_peak()
    samples = [run_once(runner, test, rng, vocab, timer) for _ in range(reps)]
    return Result(runner.name, test, samples, stats, timer.peak(), minfer_env())


def minfer_env() -> dict:
    from minfer.process_env import environ_snapshot

    return environ_snapshot()


# ---------------------------------------------------------------- A/B

def parse_env(spec: str) -> dict[str, str | None]:
    """'A=1 B=0' (or 'A=1,B=0') -> {'A': '1', 'B': '0'}; a bare 'A' means: unset A. A comma starts
    a new setting only before an upper-case NAME (an environment variable's); otherwise it belongs
    to the value: 'MINFER_PDL_EARLY_SITES=rope_kv,swiglu' is one setting."""
    out: dict[str, str | None] = {}
    try:
        words = shlex.split(spec)
    except ValueError as e:      # an unclosed quote
        raise MinferError(f"--ab {spec!r}: {e}") from None
    items: list[str] = []
    for word in words:
        for i, part in enumerate(word.split(",")):
            if i and items and not re.match(r"[A-Z_][A-Z0-9_]*(=|$)", part):
                items[-1] += "," + part          # a comma inside the value
            elif part:
                items.append(part)
    for item in items:
        key, eq, value = item.partition("=")
        if not key.isidentifier():
            raise MinferError(f"--ab {spec!r}: {item!r} is not ENV=VALUE (or a bare ENV to unset it)")
        out[key] = value if eq else None
    if not out:
        raise MinferError(f"--ab {spec!r}: expected at least one ENV=VALUE")
    return out


def run_ab(runner, tests: list[Test], env_a: dict, env_b: dict, pairs: int, reps: int, rng,
           vocab: int, timer: Timer, stats: ModelStats, log=print) -> dict:
    """`pairs` pairs, each side `reps` repetitions of every test, in the order A B, B A, A B ...
    (odd pairs start with B: a bias toward whichever side runs second -- docs/perf-log.md
    section 10, "The A/B order": B ahead on pp512 in four unrelated comparisons -- cancels over
    an even number of pairs); the ratio B/A per pair, and its mean, sd, min and max over the
    pairs. Each side is a set of switch changes ({'MINFER_X': value}) that `runner.configure`
    applies to the engine's own switches (a changed copy; the environment is never touched).
    Every measurement starts with one excluded repetition (the switch change dropped the
    engine's captured graphs)."""
    if pairs < 4:
        raise MinferError(f"--pairs {pairs}: A/B needs at least 4 pairs to show a spread")
    rows, results = [], []
    for i in range(pairs):
        for t in tests:
            ts = {}                                            # side -> t/s
            order = (("A", env_a), ("B", env_b)) if i % 2 == 0 else (("B", env_b), ("A", env_a))
            for side, env in order:
                applied = runner.configure(env)
                # a warm-up repetition after each switch change, excluded: the change dropped the
                # captured graphs, and the first repetition would time their capture (H200,
                # 2026-12-01: the side measured first in a pair ran ~10% slower at tg128, either side)
                r = measure(runner, t, reps, rng, vocab, timer, warmup=True, stats=stats)
                r.env = {**r.env, **{k: v for k, v in applied.items()}, "ab_side": side}
                results.append(r)
                ts[side] = r.avg_ts
            ratio = ts["B"] / ts["A"]
            rows.append({"pair": i + 1, "test": t.name, "a_ts": ts["A"], "b_ts": ts["B"], "ratio": ratio})
            log(f"pair {i + 1}/{pairs}  {t.name:>14}  A {ts['A']:10.2f} t/s  "
                f"B {ts['B']:10.2f} t/s  B/A {ratio:.4f}")
    summary = []
    for t in tests:
        r = np.array([row["ratio"] for row in rows if row["test"] == t.name])
        summary.append({"test": t.name, "n_pairs": len(r), "ratio_mean": float(r.mean()),
                        "ratio_sd": float(r.std(ddof=1)), "ratio_min": float(r.min()),
                        "ratio_max": float(r.max())})
    runner.configure({})                 # back to the engine's own switches
    return {"a": env_a, "b": env_b, "pairs": rows, "summary": summary,
            "results": [x.to_json() for x in results]}


# ---------------------------------------------------------------- formatting

def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _num(x: float | None) -> str:
    """3 significant digits at small magnitudes (tiny test models), whole numbers above 100."""
    if x is None:
        return ""
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def table(results: list[Result], backend: str, peer_ratio: dict | None = None) -> str:
    """llama-bench's markdown table, with roofline and memory columns added."""
    head = ["model", "size", "params", "backend", "test", "t/s", "TFLOP/s", "GB/s", "peak mem"]
    if peer_ratio:
        head.append("minfer/peer")
    rows = []
    for r in results:
        be = backend if r.runner == "minfer" else r.runner
        row = [r.stats.desc, _size(r.stats.size_bytes), _params(r.stats.n_params), be, r.test.name,
               f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}",
               _num(r.tflops), _num(r.gbps),
               _size(r.peak_mem_bytes) if r.peak_mem_bytes else ""]
        if peer_ratio:
            ratio = peer_ratio.get(r.test.name) if r.runner == "minfer" else None
            row.append(f"{ratio:.3f}" if ratio is not None else "")
        rows.append(row)
    right = {"size", "params", "test", "t/s", "TFLOP/s", "GB/s", "peak mem", "minfer/peer"}
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.rjust(w[i]) if head[i] in right else c.ljust(w[i])
                                           for i, c in enumerate(cells)) + " |"
    sep = "| " + " | ".join(("-" * (w[i] - 1) + ":") if h in right else "-" * w[i]
                            for i, h in enumerate(head)) + " |"
    return "\n".join([fmt(head), sep] + [fmt(r) for r in rows])


def ab_text(ab: dict) -> str:
    lines = [f"A/B: A = {ab['a']}  B = {ab['b']}  ({ab['summary'][0]['n_pairs']} interleaved pairs)", "",
             "| pair | test | A t/s | B t/s | B/A |", "| ---: | ---: | ---: | ---: | ---: |"]
    for p in ab["pairs"]:
        lines.append(f"| {p['pair']} | {p['test']} | {p['a_ts']:.2f} | {p['b_ts']:.2f} | {p['ratio']:.4f} |")
    lines += ["", "| test | B/A mean | sd | min | max |", "| ---: | ---: | ---: | ---: | ---: |"]
    for s in ab["summary"]:
        lines.append(f"| {s['test']} | {s['ratio_mean']:.4f} | {s['ratio_sd']:.4f} | "
                     f"{s['ratio_min']:.4f} | {s['ratio_max']:.4f} |")
    return "\n".join(lines)


def markdown_summary(record: dict, table_text: str) -> str:
    """The recorded run as markdown: date, machine, commit, command, then the table (the
    A/B pairs and ratios for an A/B run)."""
    m = record["machine"]
    gpu = m.get("gpu")
    smi = (gpu or {}).get("nvidia_smi") or [{}]
    lines = [f"# minfer bench: {record['model']['desc']}", "",
             f"- date: {m['date']}",
             f"- GPU: {gpu['name']} ({gpu['sm_count']} SMs, SM clock {smi[0].get('clocks.sm', '?')} / "
             f"max {smi[0].get('clocks.max.sm', '?')} MHz)" if gpu else f"- CPU: {m['cpu']} ({m['torch_threads']} threads)",
             f"- commit: {m.get('commit')}{' (dirty)' if m.get('dirty') else ''}",
             f"- versions: python {m['python']}, torch {m['torch']}, triton {m['triton']}, minfer {m['minfer']}",
             f"- command: `{record['command']}`",
             f"- MINFER_* env: {m['env'] or 'none'}", "", table_text, ""]
    return "\n".join(lines)


def log_err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the whole run

def run_bench(model: str, device: str, n_prompt: list[int], n_gen: list[int], depths: list[int],
              reps: int, seed: int = 0, peer: str | None = None, ab: list[str] | None = None,
              pairs: int = 4, command: str = "", progress: bool = True) -> dict:
    """Load the model, run the tests (and the peer, or the A/B), return the JSON record."""
    from minfer.bench.machine import machine_info
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.engine import Engine

    if reps < 1:
        raise MinferError(f"-r {reps}: expected at least 1 repetition")
    tests = make_tests(n_prompt, n_gen, depths)
    if ab and peer:
        raise MinferError("--ab and --peer do not combine: an A/B compares two minfer "
                          "configurations; run the peer comparison separately")
    if ab and len(ab) != 2:
        raise MinferError(f"--ab takes two configurations (A and B), got {len(ab)}")
    ab_envs = (parse_env(ab[0]), parse_env(ab[1])) if ab else None
    if ab and pairs < 4:
        raise MinferError(f"--pairs {pairs}: A/B needs at least 4 pairs to show a spread")
    if ab_envs:                          # unknown or malformed switches fail before the load
        from minfer.switches import Switches

        for env in ab_envs:
            Switches().with_env(env)
    if peer:   # fail before loading and measuring, not after
        from minfer.bench.peers import check_peer

        check_peer(peer, device)
    gf = GGUFFile(resolve_model(model))
    if peer:
        from minfer.bench.peers import check_peer_file

        check_peer_file(gf)
    stats = ModelStats.from_gguf(gf)
    n_ctx = max(t.depth + t.n for t in tests) + 1
    log = log_err if progress else (lambda msg: None)
    log(f"loading {gf.path} on {device} (context {n_ctx})")
    eng = Engine.load(gf, device=device, ctx=n_ctx, progress=progress)
    vocab = int(eng.config.vocab)
    timer = Timer(device)
    rng = np.random.default_rng(seed)
    runner = EngineRunner(eng)
    record: dict = {"format": FORMAT, "command": command, "machine": machine_info(device),
                    "model": {k: v for k, v in stats.__dict__.items()},
                    "args": {"n_prompt": n_prompt, "n_gen": n_gen, "depth": depths, "reps": reps,
                             "device": device, "seed": seed, "peer": peer, "ab": ab, "pairs": pairs},
                    "results": [], "peer_ratios": {}, "ab": None}
    results: list[Result] = []
    if ab_envs:
        record["ab"] = run_ab(runner, tests, ab_envs[0], ab_envs[1], pairs, reps, rng,
                              vocab, timer, stats, log)
        record["table"] = ab_text(record["ab"])
        return record

    for t in tests:
        r = measure(runner, t, reps, rng, vocab, timer, stats=stats)
        results.append(r)
        log(f"minfer      {t.name:>14}: {r.avg_ts:10.2f} ± {r.stdev_ts:.2f} t/s")
    if peer:
        # The engine is freed first so that each side's peak memory is its own; the peer then
        # runs the same tests (fresh random ids from the same generator) in the same process.
        import gc

        import torch

        from minfer.bench.peers import load_peer

        del runner, eng
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        log(f"loading the {peer} peer (weights dequantized to bf16 on the GPU)")
        peer_runner = PeerRunner(load_peer(peer, gf, device, n_ctx))
        for t, r in zip(tests, list(results)):
            p = measure(peer_runner, t, reps, rng, vocab, timer, stats=stats)
            results.append(p)
            record["peer_ratios"][t.name] = r.avg_ts / p.avg_ts
            log(f"{peer:<11} {t.name:>14}: {p.avg_ts:10.2f} ± {p.stdev_ts:.2f} t/s  "
                f"(minfer/peer {r.avg_ts / p.avg_ts:.3f})")
    record["results"] = [r.to_json() for r in results]
    backend = "CUDA" if device == "cuda" else f"CPU ({record['machine']['torch_threads']} threads)"
    record["table"] = table(results, backend, record["peer_ratios"] or None)
    return record
