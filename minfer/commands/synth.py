"""`minfer synth`: write a GGUF with random weights at a real model's geometry."""

from __future__ import annotations

import argparse

HELP = "write a GGUF with random weights at a real model's geometry (for benchmarks and tests)"

DESCRIPTION = """\
Write OUT.gguf: a model with a real model's geometry (tensor names, shapes, per-tensor
quantization types, metadata, a tokenizer) and random weights (std 0.02, RMSNorm gains ~1),
so minfer -- and llama.cpp, given --tokenizer-from -- can load it and time it without a
download. The weights are genuine quantizations of random floats.

Presets: qwen2.5-7b (the benchmark geometry), qwen2.5-1.5b, qwen2.5-0.5b, llama-3-8b,
llama3.1-8b, smollm2-135m, qwen3-8b, gemma3-4b, gemma2-2b, olmo2-7b, qwen3-30b-a3b (mixture of experts),
granite-3.3-8b, smollm3-3b, ernie4.5-0.3b, glm4-9b, tiny (tests: 4 layers, GQA 4:1, one row length
that is not a multiple of 256), tiny-moe.

Recipes: q4_k_m -- llama.cpp's Q4_K_M rule: Q4_K everywhere, Q6_K for output.weight and for
attn_v/ffn_down in the layers i < n/8, i >= 7n/8, (i - n/8) % 3 == 2; a k-quant whose rows
are not a multiple of 256 falls back to Q5_0 (from Q4_K) or Q8_0 (from Q6_K) as llama.cpp
does. q4_0, q8_0, f16 -- every 2-D weight in that one type. 1-D norms and biases are F32.

examples:
  minfer synth /tmp/qwen7b.gguf --preset qwen2.5-7b
  minfer synth /tmp/q7-4l.gguf --preset qwen2.5-7b --layers 4
  minfer synth /tmp/q7.gguf --preset qwen2.5-7b --tokenizer-from qwen2.5-coder-0.5b-instruct
  minfer synth /tmp/tiny.gguf --preset tiny --arch llama --recipe q8_0
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minfer.bench.presets import PRESETS
    from minfer.bench.synth import RECIPES

    p.add_argument("out", metavar="OUT.gguf", help="the file to write (overwritten if present; missing "
                   "folders are made; a write that fails or is stopped leaves no part-written file)")
    p.add_argument("--preset", required=True, choices=list(PRESETS), help="the geometry to copy")
    p.add_argument("--arch", choices=["qwen2", "llama"], default=None,
                   help="architecture to write (default: the preset's; qwen2 adds q/k/v biases)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="number of layers (default: the preset's); fewer layers make a quick file "
                   "with the same per-layer shapes")
    p.add_argument("--recipe", choices=list(RECIPES), default="q4_k_m",
                   help="quantization types of the 2-D weights (default: q4_k_m)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same file (default 0)")
    p.add_argument("--vocab", type=int, default=None, metavar="N", help="vocabulary rows (default: the preset's)")
    p.add_argument("--tokenizer-from", metavar="MODEL", default=None,
                   help="copy the tokenizer (tokens padded to the vocab with '[PAD<i>]', merges, "
                   "pre-tokenizer, special ids, chat template) from this GGUF file or catalog "
                   "model, so that other engines accept the file; default: a minimal byte-level "
                   "vocab that only minfer is expected to run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    import time

    from minfer.bench.presets import get_preset
    from minfer.bench.synth import copied_tokenizer, plan_tensors, write_synth
    from minfer.commands.common import missing_folders

    from pathlib import Path

    from minfer.errors import MinferError

    if not 0 <= args.seed < 2**63:   # numpy's generator takes a non-negative seed
        raise MinferError(f"--seed {args.seed}: expected an integer in 0..2**63-1")
    if not args.out:   # (an unset shell variable) was "a directory", Path('') being '.'
        raise MinferError("OUT.gguf is empty: give the path of the file to write, e.g. /tmp/model.gguf")
    if Path(args.out).is_dir():
        raise MinferError(f"{args.out}: a directory; OUT.gguf is the file to write, "
                          f"e.g. {Path(args.out) / 'model.gguf'}")
    preset = get_preset(args.preset).with_overrides(args.arch, args.layers, args.vocab)
    tok = None
    if args.tokenizer_from:
        from minfer.catalog import resolve_model

        tok = copied_tokenizer(resolve_model(args.tokenizer_from))
        n = len(tok.get("tokenizer.ggml.tokens", ()))
        if n > preset.vocab:   # was "tokenizer: its tokenizer has N tokens", naming neither flag nor model
            raise MinferError(f"--tokenizer-from {args.tokenizer_from}: its tokenizer has {n} tokens, more than "
                              f"the {preset.vocab} vocabulary rows being written; give --vocab {n} (or more), "
                              "or a preset of the same family")
    out = Path(args.out)
    found, missing = missing_folders(out)
    if not found.is_dir():   # was "cannot write the model file: File exists (x.gguf)"
        raise MinferError(f"{args.out}: cannot write the model file: {found} is a file, not a folder")
    plans = plan_tensors(preset, args.recipe)   # once: the free-space check and the write take it
    _check_disk(out, plans)
    before = _stamp(out)
    t0 = time.perf_counter()
    try:
        res = write_synth(args.out, preset, args.recipe, args.seed, tok, progress=not args.no_progress,
                          plans=plans)
    except BaseException as e:
        # a full disk, an error or Ctrl-C part way: the part written was left there, a file that
        # looked like a model and failed to load (its tensors past the end)
        _remove_partial(out, before, missing)
        if not isinstance(e, OSError):
            raise
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(args.out) else ""
        raise MinferError(f"{args.out}: cannot write the model file: {e.strerror or e}{where}") from e
    dt = time.perf_counter() - t0
    types = ", ".join(f"{k} x{v}" for k, v in sorted(res.type_counts.items()))
    print(f"wrote {res.path}: {preset.name} ({preset.arch}, {preset.n_layers} layers, recipe "
          f"{args.recipe}), {res.n_tensors} tensors ({types}), "
          f"{_human(res.n_bytes)} of tensor data in {dt:.1f} s")
    return 0


def _stamp(out):
    """What identifies the file at `out` now (None when there is none), to tell whether a failed
    write replaced it."""
    try:
        st = out.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _remove_partial(out, before, missing) -> None:
    """After a failed write: the file it wrote (not one it never reached) and the folders it made."""
    import contextlib

    if _stamp(out) != before and out.is_file():
        with contextlib.suppress(OSError):
            out.unlink()
    for folder in missing:   # deepest first; a folder something else wrote into stays
        with contextlib.suppress(OSError):
            folder.rmdir()


def _check_disk(out, plans) -> None:
    """A file larger than the free space of its disk (`plans`: its tensors, as plan_tensors gives
    them and write_synth then writes them): one line before writing. It was written until the
    disk was full (`--layers 100000` of the tiny preset: 47 GB), then left there, part written,
    with the disk still full."""
    import shutil

    from minfer.bench.synth import tensor_nbytes
    from minfer.commands.common import missing_folders
    from minfer.errors import MinferError

    need = sum(tensor_nbytes(t) for t in plans)
    where, _ = missing_folders(out)   # (write_synth makes the missing folders)
    try:
        free = shutil.disk_usage(where).free + (out.stat().st_size if out.is_file() else 0)
    except OSError:   # no answer: the write's own error stands
        return
    if need > free:
        raise MinferError(f"{out}: the model file needs {_human(need)} of tensor data but {where} has "
                          f"{_human(free)} free; use fewer --layers, a smaller --recipe or another place")


def _human(n: int) -> str:
    """2.34 GiB, 1.81 MiB: the tiny presets' data read "0.00 GiB" in GiB alone."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
