"""`minfer inspect`: what is inside a GGUF file, without loading the weights."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from minfer.safe_text import safe

HELP = "show a GGUF file's architecture, hyper-parameters, tokenizer and tensor types"
DESCRIPTION = """\
Show what a GGUF model file holds: architecture, name, parameter count, file type
(llama.cpp's quantization mix, e.g. Q4_K_M), file size, context length, every
hyper-parameter of the architecture, the tokenizer, and a table of the tensors grouped
by ggml type (count, bytes, share of all tensor bytes; a type minfer cannot run is marked).
Nothing is loaded into memory: the file is validated and memory-mapped.

Works on any architecture, including ones minfer cannot run yet. Names and values come
from the file, so they are shown escaped (control characters as \\x1b ...) and cut; metadata
keys minfer would refuse are marked, with what is wrong.

examples:
  minfer inspect qwen2.5-coder-0.5b-instruct
  minfer inspect model.gguf --tensors
  minfer inspect model.gguf --json | python -m json.tool
"""

# Lists longer than this are summarized by their length (a vocabulary has ~150k entries).
MAX_LIST = 16



# what an embeddings run makes of pooling_type (llama.h llama_pooling_type; runtime/embed.py)
_POOLING_NOTE = {0: "  (none: a vector per token)", 1: "  (mean: minfer embed)", 2: "  (cls: minfer embed)",
                 3: "  (last: minfer embed)", 4: "  (rank: a reranker's head, not supported)"}


def _pooling_note(key: str, value) -> str:
    """The note after pooling_type's value; nothing for another key or a value of another type (an array, a
    string: any value a file may hold)."""
    if key != "pooling_type" or type(value) is not int:
        return ""
    return _POOLING_NOTE.get(value, "")

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="FILE_OR_NAME", nargs="?", default=None,
                   help="path to a .gguf file, or a catalog name (`minfer list`; pulled if missing)")
    p.add_argument("-m", "--model", dest="model_opt", default=None, metavar="FILE_OR_NAME",
                   help="the same, as the other commands take it")
    p.add_argument("--tensors", action="store_true",
                   help="also list every tensor: name, type, shape (numpy order), bytes")
    p.add_argument("--json", action="store_true",
                   help="print everything as one JSON object (long lists summarized by length)")


def human_count(n: int) -> str:
    """494032768 -> '494.0M' (the style of llama.cpp's model loader)."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.{2 if unit in 'BT' else 1}f}{unit}"
    return str(n)


def human_bytes(n: int) -> str:
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _plain(value: Any) -> Any:
    """A metadata value for display: long lists become {'length': n} summaries."""
    if isinstance(value, list):
        if len(value) > MAX_LIST:
            return {"length": len(value)}
        return [_plain(v) for v in value]
    return value


def summarize(g: Any, with_tensors: bool = False) -> dict[str, Any]:
    """Everything `inspect` shows, as a JSON-ready dict. g: minfer.gguf_file.GGUFFile."""
    arch = g.get("general.architecture")
    prefix = f"{arch}."
    n_params = g.n_params()
    total = g.tensor_bytes()
    by_type: dict[str, dict[str, Any]] = {}
    for t in g.tensors.values():
        row = by_type.setdefault(t.type_name, {"count": 0, "bytes": 0, "params": 0})
        row["count"] += 1
        row["bytes"] += t.n_bytes
        row["params"] += t.n_elements
    for row in by_type.values():
        row["share"] = row["bytes"] / total if total else 0.0
    from minfer.quants import is_supported

    # the types minfer cannot decode (IQ2_XXS, IQ1_S, I32, ...): the load would stop at such a tensor
    unsupported = sorted({t.type_name for t in g.tensors.values() if not is_supported(t.qtype)})
    tokens = g.get("tokenizer.ggml.tokens")
    merges = g.get("tokenizer.ggml.merges")
    tok_scalars = {k.removeprefix("tokenizer.ggml."): _plain(v) for k, v in g.metadata.items()
                   if k.startswith("tokenizer.ggml.") and not isinstance(v, list)}
    out: dict[str, Any] = {
        "file": str(g.path),
        "file_size": g.file_size,
        "gguf_version": g.version,
        "architecture": arch,
        "name": g.get("general.name"),
        "n_params": n_params,
        "n_params_human": human_count(n_params),
        "file_type": g.file_type_name(),
        "context_length": g.get(f"{arch}.context_length"),
        "n_layers": g.get(f"{arch}.block_count"),
        "hparams": {k.removeprefix(prefix): _plain(v) for k, v in g.metadata.items()
                    if k.startswith(prefix)},
        "general": {k.removeprefix("general."): _plain(v) for k, v in g.metadata.items()
                    if k.startswith("general.")},
        "tokenizer": {
            **tok_scalars,
            "vocab_size": len(tokens) if isinstance(tokens, list) else None,
            "n_merges": len(merges) if isinstance(merges, list) else None,
            "chat_template": "tokenizer.chat_template" in g.metadata,
        },
        "tensor_bytes": total,
        "n_tensors": len(g.tensors),
        "tensor_types": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"])),
        "unsupported_tensor_types": unsupported,
        "problems": _problems(g),
    }
    if with_tensors:
        out["tensors"] = [{"name": t.name, "type": t.type_name, "shape": list(t.shape),
                           "bytes": t.n_bytes, "offset": t.offset} for t in g.tensors.values()]
    return out


def _problems(g: Any) -> dict[str, str]:
    """{metadata key: what is wrong} for the keys minfer reads (minfer.metadata_check)."""
    from minfer import metadata_check

    return metadata_check.problems(g)


def format_table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Aligned columns; the column indices in `right` are right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _fmt(v: Any) -> str:
    """A value for the text view: one escaped line of at most ~80 characters."""
    if isinstance(v, dict) and set(v) == {"length"}:
        return f"[{v['length']} items]"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str):
        return f'"{safe(v, 78)}"'
    if isinstance(v, list):
        return safe(json.dumps(v, ensure_ascii=False), 80)
    return safe(v, 80)


def _marked(key: str, value: str, problems: dict[str, str]) -> str:
    return f"{value}  <-- invalid: {problems[key]}" if key in problems else value


def render_text(s: dict[str, Any]) -> str:
    tok = s["tokenizer"]
    bad = s.get("problems", {})
    arch = s["architecture"]
    lines = [
        f"file:            {safe(s['file'], 300)}",
        f"file size:       {human_bytes(s['file_size'])} ({s['file_size']:,} bytes), GGUF v{s['gguf_version']}",
        f"architecture:    {_fmt(arch) if not isinstance(arch, str) else safe(arch, 60)}",
        f"name:            {safe(s['name'], 80)}",
        f"parameters:      {s['n_params_human']} ({s['n_params']:,})",
        f"file type:       {s['file_type']}",
        f"context length:  {safe(s['context_length'], 40)}",
        f"layers:          {safe(s['n_layers'], 40)}",
        "",
        f"hyper-parameters ({safe(arch, 60)}.*):",
    ]
    hp_rows = [[safe(k, 60), _marked(f"{arch}.{k}", _fmt(v), bad) + _pooling_note(k, v)]
               for k, v in s["hparams"].items()]
    lines += [f"  {line}" for line in format_table(hp_rows, set())] if hp_rows else ["  (none)"]
    lines += ["", "tokenizer:"]
    tok_rows = [[safe(k, 60), _marked(f"tokenizer.ggml.{k}", _fmt(v), bad)] for k, v in tok.items()
                if v is not None]
    lines += [f"  {line}" for line in format_table(tok_rows, set())]
    lines += ["", f"tensors: {s['n_tensors']}, {human_bytes(s['tensor_bytes'])} ({s['tensor_bytes']:,} bytes)"]
    rows = [["type", "count", "params", "bytes", "share"]]
    unsupported = s.get("unsupported_tensor_types", [])
    for name, r in s["tensor_types"].items():
        rows.append([name, str(r["count"]), human_count(r["params"]), human_bytes(r["bytes"]),
                     f"{100 * r['share']:.1f}%"])
    lines += [f"  {line}" + ("  <-- minfer cannot run this type" if name in unsupported else "")
              for line, name in zip(format_table(rows, {1, 2, 3, 4}), ["", *s["tensor_types"]])]
    if "tensors" in s:
        lines += ["", "every tensor:"]
        rows = [["name", "type", "shape", "bytes"]]
        rows += [[safe(t["name"], 64), t["type"], "x".join(map(str, t["shape"])) or "scalar", f"{t['bytes']:,}"]
                 for t in s["tensors"]]
        lines += [f"  {line}" for line in format_table(rows, {3})]
    if bad:
        lines += ["", f"problems: {len(bad)} metadata keys minfer would refuse to load:"]
        lines += [f"  {safe(k, 80)}: {v}" for k, v in bad.items()]
    return "\n".join(lines)


# Characters JSON leaves raw that a terminal would act on or that reorder the display (DEL,
# C1 controls, line separators, bidi controls); written as \u escapes the JSON is unchanged.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f]")


def safe_json(obj: Any) -> str:
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def main(args: argparse.Namespace) -> int:
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile

    if (args.model is None) == (args.model_opt is None):
        from minfer.errors import MinferError

        raise MinferError("give the model once: as FILE_OR_NAME or with -m/--model")
    g = GGUFFile(resolve_model(args.model if args.model is not None else args.model_opt))
    s = summarize(g, with_tensors=args.tensors)
    if args.json:
        print(safe_json(s))
    else:
        print(render_text(s))
    return 0
