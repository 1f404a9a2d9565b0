"""`minfer bench`: llama-bench-style throughput of a model (pp / tg tokens per second)."""

from __future__ import annotations

import argparse
import os

HELP = "measure prefill (pp) and generation (tg) speed, llama-bench style; A/B of switches"

DESCRIPTION = """\
Measure a model's speed the way llama.cpp's llama-bench does, and print its table.

  pp<N>        prefill of N random token ids into a fresh cache (logits of the last token)
  tg<N>        N tokens generated one at a time (random ids: EOS never ends a run)
  ... @ d<D>   the same after a D-token context is in the cache (-d D)

Each test runs one warm-up repetition (not counted), then -r repetitions; t/s is the mean
± sample sd over the repetitions. Also printed: achieved TFLOP/s for pp (matrix + causal
attention FLOPs), GB/s of weights read for tg, and peak GPU memory. The device is
synchronized before every clock read.

--ab 'X=1' 'X=0' measures two settings of minfer's switches (`python -m minfer.switches`
lists them) in one process, interleaved for --pairs pairs in the order A B, B A, A B ... (so a
bias toward the side that runs second cancels), and prints each pair and the ratio B/A (mean,
sd, min, max). Each side is a changed copy of the engine's switches (the environment is not
touched; captured CUDA graphs are dropped when the switches change, so each side's -r repetitions
follow one excluded warm-up). A switch that acts at
load (MINFER_ACT_DTYPE, MINFER_GEMV_REPACK, MINFER_THREADS) needs two runs.

--peer torch-bf16 (CUDA) then runs the same weights dequantized to bf16 through a plain torch
forward (cuBLAS + SDPA) with the same tests in the same process (minfer's engine is freed
first, so each side's peak memory is its own), and prints minfer/peer ratios.

Recorded runs: --out bench/results/NAME.json writes the JSON record (machine, versions,
commit, every sample) and NAME.md (the summary); --plot turns those into a PNG
(see bench/results/README.md).

examples:
  minfer synth /tmp/q7.gguf --preset qwen2.5-7b
  minfer bench -m /tmp/q7.gguf -p 512,3354 -n 128
  minfer bench -m /tmp/q7.gguf -p 3354 -n 0 --peer torch-bf16
  minfer bench -m /tmp/q7.gguf -p 3354 -n 128 --ab 'MINFER_GEMV=1' 'MINFER_GEMV=0' --pairs 6
  minfer bench -m /tmp/q7.gguf --out bench/results/2026-11-30-h200.json
  minfer bench --plot bench/results --plot-out bench/results/tps.png
"""


def _ints(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: expected comma-separated integers, e.g. 512,3354")
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{s!r}: counts cannot be negative")
    return vals


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent

    # -m, --device, -t/--threads, -ngl as every command; no -c: each test sizes its own context
    return [engine_parent(ctx=False)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minfer.commands.serve import parse_size
    p.add_argument("-p", "--n-prompt", type=_ints, default=[512], metavar="N[,N..]",
                   help="prompt lengths of the pp tests (default: 512; 0 = no pp test)")
    p.add_argument("-n", "--n-gen", type=_ints, default=[128], metavar="N[,N..]",
                   help="tokens generated in the tg tests (default: 128; 0 = no tg test)")
    p.add_argument("-d", "--depth", type=_ints, default=[0], metavar="D[,D..]",
                   help="tokens already in the cache before each test (default: 0)")
    p.add_argument("-r", "--repetitions", type=int, default=None, metavar="N", help="repetitions per test (default: 5)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table",
                   help="print the markdown table (default) or the JSON record")
    p.add_argument("--out", metavar="FILE.json", default=None,
                   help="also write the JSON record to FILE.json and the markdown summary to FILE.md "
                   "(missing folders are made; checked before measuring)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random token ids (default 0)")
    p.add_argument("--ab", nargs=2, metavar=("ENV_A", "ENV_B"), default=None,
                   help="interleaved A/B of two switch settings, e.g. 'MINFER_GEMV=1' "
                   "'MINFER_GEMV=0' (several: 'X=1 Y=2'; a bare X unsets it)")
    p.add_argument("--pairs", type=int, default=None, metavar="N", help="A/B pairs with --ab (at least 4; default 4)")
    p.add_argument("--peer", choices=["torch-bf16"], default=None,
                   help="also run a plain torch bf16 forward of the same weights (CUDA only)")
    p.add_argument("--plot", nargs="+", metavar="DIR_OR_JSON", default=None,
                   help="instead of benchmarking: plot recorded runs (tok/s by commit and test) "
                   "to --plot-out (needs matplotlib: pip install 'minfer[plot]')")
    p.add_argument("--plot-out", metavar="FILE.png", default=None,
                   help="where --plot writes the PNG (default: bench/results/tps.png)")
    p.add_argument("--no-progress", action="store_true", help="no loading bar or per-test log")
    p.add_argument("--parallel", type=_ints, default=None, metavar="B[,B..]",
                   help="instead: B sequences at once through the batch engine (continuous batching, "
                   "paged KV cache), llama-batched-bench's table for each B, with -p and -n (one value "
                   "each) as the prompt and generated lengths, e.g. --parallel 1,8,32,128")
    p.add_argument("--kv-memory", type=parse_size, default=None, metavar="SIZE",
                   help="with --parallel: paged KV cache size, e.g. 16G (default: every sequence's "
                   "whole context, twice)")
    p.add_argument("--dense-planes", choices=["auto", "on", "off"], default="auto",
                   help="with --parallel on CUDA: a resident bf16 copy of every matrix for cuBLAS "
                   "(auto: when it takes at most half the free memory; off: dequantize per step)")


def check_out(out: str | None) -> None:
    """--out, checked before minutes of measuring: a directory or an unwritable place is an error
    now, not a traceback once the run is done."""
    from pathlib import Path

    from minfer.errors import MinferError

    if out is None:
        return
    if not out:   # (an unset shell variable) was ": a directory", Path('') being '.'
        raise MinferError("--out is empty: give the JSON file to write, e.g. bench/results/run.json")
    p = Path(out)
    if p.is_dir():
        raise MinferError(f"--out {out}: a directory; --out names the JSON file to write, e.g. "
                          f"{p / 'run.json'}")
    if p.suffix == ".md":   # the JSON went to FILE.md, then the summary overwrote it
        raise MinferError(f"--out {out}: --out names the JSON file, and its .md summary is written beside "
                          f"it; give {p.with_suffix('.json')}")
    from minfer.commands.common import missing_folders

    found, _ = missing_folders(p)
    if not found.is_dir():   # was "cannot create its folder: File exists"
        raise MinferError(f"--out {out}: cannot create its folder: {found} is a file, not a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinferError(f"--out {out}: cannot create its folder: {e.strerror or e}") from e
    if not os.access(p.parent, os.W_OK):
        raise MinferError(f"--out {out}: its folder {p.parent} is not writable")


def _write_record(out, record: str, summary: str) -> None:
    """FILE.json and FILE.md, whole or not at all: a write that failed (a full disk) left the part
    written, a truncated JSON record that --plot then read."""
    done = []
    try:
        for path, text in ((out, record), (out.with_suffix(".md"), summary)):
            with open(path, "w") as f:   # (a file that could not be opened was not touched)
                done.append(path)
                f.write(text)
    except BaseException:
        for path in done:
            try:
                path.unlink()
            except OSError:
                pass
        raise


def main(args: argparse.Namespace) -> int:
    import json
    import os
    import shlex
    import sys
    from pathlib import Path

    from minfer.errors import MinferError

    if not args.parallel and (args.kv_memory is not None or args.dense_planes != "auto"):
        flag = "--kv-memory" if args.kv_memory is not None else "--dense-planes"
        raise MinferError(f"{flag} applies to the batched table only: give --parallel B[,B..] too")
    if args.plot_out is not None and not args.plot:   # was ignored without a word: no plot, no file
        raise MinferError(f"--plot-out {args.plot_out} names the PNG that --plot writes: give --plot DIR_OR_JSON too")
    if args.plot:   # --plot measures nothing: a measurement's flags were dropped without a word
        for flag, given in (("-p/--n-prompt", args.n_prompt != [512]), ("-n/--n-gen", args.n_gen != [128]),
                            ("-d/--depth", args.depth != [0]), ("-r/--repetitions", args.repetitions is not None),
                            ("--out", args.out is not None), ("-o/--output", args.output != "table"),
                            ("--ab", args.ab is not None), ("--peer", args.peer is not None),
                            ("--parallel", args.parallel is not None), ("--seed", args.seed != 0)):
            if given:
                raise MinferError(f"{flag} applies to a measurement; --plot only plots recorded runs "
                                  "(run the measurement and the plot separately)")
    check_out(args.out)
    if not 0 <= args.seed < 2**63:   # numpy's generator takes a non-negative seed: was a traceback, after the load
        raise MinferError(f"--seed {args.seed}: expected an integer in 0..2**63-1")
    if args.pairs is not None and args.ab is None:   # was ignored without a word
        raise MinferError(f"--pairs {args.pairs} sets how many A/B pairs --ab runs: give --ab ENV_A ENV_B too")
    for spec in args.ab or []:   # bench.parse_env splits them as shell words; shlex's ValueError
        try:                     # (an unclosed quote) would otherwise be a traceback
            shlex.split(spec)
        except ValueError as e:
            raise MinferError(f"--ab {spec!r}: not shell words ({e})") from None
    if args.plot:
        from minfer.bench.plot import plot_runs

        plot_out = args.plot_out or "bench/results/tps.png"
        n = plot_runs(args.plot, plot_out)
        print(f"wrote {plot_out} ({n} recorded runs)")
        return 0

    if args.parallel:
        # the batched table has one prompt and one generated length, no depth, A/B or peer: these
        # were dropped without a word (-p 128,512 measured 128 alone)
        for flag, given in (("-p/--n-prompt", len(args.n_prompt) > 1), ("-n/--n-gen", len(args.n_gen) > 1)):
            if given:
                raise MinferError(f"{flag} takes one value with --parallel (the batched table's prompt or "
                                  "generated length); run once per length")
        for flag, given in (("-d/--depth", args.depth != [0]), ("--ab", args.ab is not None),
                            ("--peer", args.peer is not None), ("-r/--repetitions", args.repetitions is not None)):
            if given:
                raise MinferError(f"{flag} applies to the pp/tg table only, not to --parallel's batched table")
        return _parallel(args)

    from minfer.bench.bench import markdown_summary, run_bench
    from minfer.commands.common import apply_threads, device_from_args, resolve_device
    from minfer.commands.preflight import check_kv_fits, check_model

    device = resolve_device(device_from_args(args))
    gf = check_model(args.model)   # an unrunnable file: one line, not a traceback from the bench's stats
    # the longest test's context (run_bench: max depth + n over the tests, + 1), checked against
    # the memory its KV cache needs before the load, not by an allocation failure or the OOM killer
    longest = max(args.depth) + max(args.n_prompt + args.n_gen) + 1
    check_kv_fits(gf, longest, device, "-p/-n/-d: the longest test needs a context of")
    _warn_past_trained(gf, longest, "-p/-n/-d: the longest test needs a context of")
    apply_threads(args)
    # the command as typed, when run as `minfer ...` (not when called as a library or in tests)
    typed = sys.argv and os.path.basename(sys.argv[0]) in ("minfer", "__main__.py") and "bench" in sys.argv
    command = "minfer " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if typed else "minfer bench (via the library)"
    record = run_bench(args.model, device, args.n_prompt, args.n_gen, args.depth,
                       5 if args.repetitions is None else args.repetitions, seed=args.seed, peer=args.peer,
                       ab=args.ab, pairs=4 if args.pairs is None else args.pairs, command=command,
                       progress=not args.no_progress)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_record(out, json.dumps(record, indent=1) + "\n", markdown_summary(record, record["table"]))
        print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(record, indent=1))
    else:
        from minfer.bench.machine import short_machine

        print(short_machine(record["machine"]))
        print()
        print(record["table"])
    return 0


def _warn_past_trained(gf, n_ctx: int, what: str) -> None:
    """A test longer than the model was trained on still measures a speed, but a new user who typed
    -p 100000 on the CPU waited long for it without a word."""
    from minfer.commands.common import warn
    from minfer.config import ModelConfig

    trained = ModelConfig.from_gguf(gf).context_length
    if n_ctx > trained:
        warn(f"{what} {n_ctx} tokens, past the {trained} {gf.path.name} was trained on; it is measured "
             "all the same (a speed, not text)")


def _parallel(args: argparse.Namespace) -> int:
    """--parallel: the batched table (minfer/bench/parallel.py)."""
    import json
    import sys
    from pathlib import Path

    from minfer.bench.parallel import run_parallel, table
    from minfer.commands.common import apply_threads, device_from_args, resolve_device
    from minfer.commands.preflight import check_model, check_parallel_bench
    from minfer.errors import MinferError
    from minfer.runtime.engine import Engine

    device = resolve_device(device_from_args(args))
    pp, tg = args.n_prompt[0], args.n_gen[0]
    if pp < 1 or tg < 1 or min(args.parallel) < 1:
        raise MinferError("--parallel needs -p >= 1, -n >= 1 and batch sizes >= 1")
    gf = check_model(args.model)   # an unrunnable file: one line before the load
    # a paged KV pool that cannot fit in memory: one line now, not an allocator's traceback
    check_parallel_bench(gf, device, max(args.parallel), pp, tg, args.kv_memory)
    _warn_past_trained(gf, pp + tg + 1, "-p/-n: each sequence needs a context of")
    if device != "cuda" and args.dense_planes != "auto":
        from minfer.commands.common import warn

        warn(f"--dense-planes {args.dense_planes}: the dense bf16 planes are a CUDA path; on the {device} "
             "it changes nothing")
    apply_threads(args)
    eng = Engine.load(args.model, device=device, ctx=pp + tg + 1, progress=not args.no_progress)
    rows = run_parallel(eng, args.parallel, pp, tg, args.kv_memory,
                        seed=args.seed, progress=not args.no_progress,
                        dense_planes={"auto": None, "on": True, "off": False}[args.dense_planes])
    from datetime import datetime, timezone

    from minfer.bench.machine import git_commit, machine_info

    record = {"kind": "parallel", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "model": str(args.model), "device": str(device), "pp": pp, "tg": tg, "rows": rows,
              "commit": git_commit(), "machine": machine_info(device)}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(record, indent=1))
    else:
        print(table(rows))
    return 0
