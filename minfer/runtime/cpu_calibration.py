"""The CPU int4 split's check at load (Engine.load with Switches.cpu_quant): pack a CPU model's matrices
(ops/cpu_quant.py) and compare it with the float32 model on a calibration text; above the KL bound its
int4 matrices are packed in int8 instead. Engine re-exports the names (minfer.runtime.engine).

The check's two forward passes cost more than the packing (0.5B: ~6 s of a ~12 s silent phase), and
its outcome is a function of the file and this code, so it is kept in a small JSON per file under
$MINFER_HOME/cache/cpu_calibration (cache_key says what it depends on). A later load of the same
file packs straight into the recorded forms, the same bytes as the checked load. Deleting that
folder forces the check again; an unreadable entry is recomputed, an unwritable home only means
no cache. Measured 2026-12-04 on the 2-core CI kind while other work held it (load average 3.4-4.6,
so 2-3x a quiet machine's times), qwen2.5-coder-0.5b, fresh processes, medians of 4: api.load
29.7 s before (10b18aa), 32.6 s with an empty cache, 17.3 s cached; prepare_cpu_quant alone
26-34 s checked against 8.5-11 s cached (what is left: the packing)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

from minfer.runtime.kv_cache import KVCache

# The CPU int4 split (ops/cpu_quant.py) is a second rounding of the file's weights, and how much
# it costs depends on the model: the mean next-token KL against float32 on CPU_CALIBRATION was
# 0.025 for Qwen2.5-0.5B (perplexity +1.2% on textwrap.py), 0.071 for gemma-3-270m (+13%), 0.002
# for SmolLM2-135M (its Q4_1 blocks fit int4). Above the bound the int4 matrices are packed
# in int8 instead (KL 0.002-0.005 on all three), so no model loses more than that silently.
CPU_INT4_KL_MAX = 0.04
CPU_CALIBRATION = ("The history of the city begins in the Roman era, when a small settlement grew on the banks of the "
                   "river. Over the centuries it became a center of trade, learning and government. Today it is known "
                   "for its museums, its parks, its bridges and its food, and every year millions of visitors walk "
                   "through its old streets.")
CACHE_VERSION = 1
CACHE_KEEP = 64     # entries kept (_prune), newest first
# minfer's front ends, which never touch the check: left out of the source hash so that editing
# them does not redo every model's check (anything else in the package may reach the forward)
_NOT_IN_KEY = ("server", "commands", "bench", "cli.py", "__main__.py")


def prepare_cpu_quant(model, tokenizer, path=None, progress: bool = False) -> dict:
    """Pack a CPU model's matrices (cpu_quant.prepare_model) and check the int4 split against the
    float32 model on CPU_CALIBRATION: above CPU_INT4_KL_MAX its int4 matrices become int8.
    path: the GGUF file the model was read from (None: no cache). progress: a tqdm bar, as the
    load's. Returns {"kl": mean KL of what is kept, "kl_int4": the split's, "refused": bool,
    "cached": whether the outcome was read from the cache instead of measured}; an encoder (Model.causal
    False: no logits) takes int8 everywhere, unchecked: {"kl": None, "kl_int4": None, "refused": False,
    "cached": False, "int8_only": True}."""
    from tqdm import tqdm

    from minfer.ops import cpu_quant

    name = Path(path).name if path is not None else "model"
    n = len(model.qweights())
    if not getattr(model, "causal", True):
        # an encoder (bert) has no next-token distribution to measure the int4 split by: int8 everywhere, the form
        # the check falls back to (KL 0.002-0.005 where measured), with nothing to check or cache
        with tqdm(total=n, desc=f"packing {name} in int8 (an encoder: no int4 check)", unit="matrix",
                  disable=not progress, leave=False) as bar:
            cpu_quant.prepare_model(model, int4=(), step=bar.update)
        return {"kl": None, "kl_int4": None, "refused": False, "cached": False, "int8_only": True}
    entry = _cache_file(path, model) if path is not None else None
    hit = _read(entry)
    if hit is not None:       # the recorded forms, packed directly (same bytes, no forward pass)
        with tqdm(total=n, desc=f"packing {name} in int4/int8 (int4 check cached)", unit="matrix",
                  disable=not progress, leave=False) as bar:
            cpu_quant.prepare_model(model, refused=hit["refused"], step=bar.update)
        return {**hit, "cached": True}

    from minfer.models.base import Step

    ids = calibration_ids(tokenizer, model.cfg.vocab)

    def logits(what):
        bar.set_description(f"checking the int4 split of {name}: {what} pass")
        cache = KVCache.for_config(model.cfg, len(ids) + 8)
        out = model.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), cache).double()
        bar.update()
        return out

    def kl(a, b):      # mean over positions past the first few of KL(a || b)
        la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        return float((la.exp() * (la - lb)).sum(-1)[4:].mean())

    # one bar over the steps: the forward passes (a few seconds each) and the matrices packed
    with tqdm(total=n + 2, desc=f"checking the int4 split of {name}", unit="step",
              disable=not progress, leave=False) as bar:
        ref = logits("float32")
        bar.set_description(f"packing {name} in int4/int8")
        cpu_quant.prepare_model(model, step=bar.update)
        got = kl(ref, logits("int4"))
        out = {"kl": got, "kl_int4": got, "refused": False}
        if got > CPU_INT4_KL_MAX:
            four = [w for w in model.qweights() if cpu_quant.is_int4(w.packed)]
            bar.total += len(four) + 1
            bar.set_description(f"packing {name}'s int4 matrices in int8")
            for w in four:
                w.packed = cpu_quant.repack_int8(w)                    # from the blocks (no dense copy left)
                bar.update()
            out.update(kl=kl(ref, logits("int8")), refused=True)
    _write(entry, out)
    return {**out, "cached": False}


def calibration_ids(tokenizer, vocab: int) -> list[int]:
    """The check's token ids: CPU_CALIBRATION encoded (at most 96). A vocab that cannot spell it (a
    SentencePiece vocab without byte tokens lacks a character of it: the tokenizer refuses the text) must
    not fail the load of a model whose user text it can spell, so such a vocab gets 96 ids drawn from the
    whole vocab by a fixed seed instead: the check then compares the two forms on that sequence."""
    from minfer.errors import MinferError

    try:
        ids = tokenizer.encode(CPU_CALIBRATION)[:96]
    except MinferError:
        ids = []
    if len(ids) >= 16:
        return ids
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (96,), generator=g).tolist()


def refusal_note(name: str, report: dict) -> str:
    """The one line that says a load refused the int4 split (report: prepare_cpu_quant's); the
    engine prints it under its progress bar, `minfer serve` logs it when its stderr is a file."""
    return (f"{name}: int4 matrices would move the next-token distribution by KL {report['kl_int4']:.3f} on a "
            f"calibration text (bound {CPU_INT4_KL_MAX}): int8 used instead (KL {report['kl']:.4f}; "
            "MINFER_CPU_QUANT=0 keeps float32)")


def cache_key(path, model) -> str:
    """What the check's outcome depends on, hashed: the file (resolved path, size, mtime and the
    sha256 of its first and last MiB, so a rewritten file misses even with the same size and
    time), torch's version, the bound, the calibration text, the model's float dtypes and
    minfer's own source (cpu_quant.py, this file, the forward, the dequantization, the
    tokenizer: ~140 files, ~30 ms)."""
    p = Path(path).resolve()
    st = p.stat()
    h = hashlib.sha256()
    with open(p, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, st.st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    dtypes = sorted({str(w.dense.dtype) for w in model.qweights() if w.dense is not None})
    parts = {"version": CACHE_VERSION, "file": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "ends_sha256": h.hexdigest(), "torch": torch.__version__, "kl_max": repr(CPU_INT4_KL_MAX),
             "text": CPU_CALIBRATION, "dtypes": dtypes, "act_dtype": str(getattr(model, "act_dtype", None)),
             "source": _source_hash()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    from minfer.catalog import minfer_home

    return minfer_home() / "cache" / "cpu_calibration"


_source = None


def _source_hash() -> str:
    global _source
    if _source is None:          # once a process: the source does not change under a running load
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            rel = f.relative_to(root)
            if rel.parts[0] in _NOT_IN_KEY:
                continue
            h.update(rel.as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        _source = h.hexdigest()
    return _source


def _cache_file(path, model) -> Path | None:
    try:
        return cache_dir() / f"{cache_key(path, model)}.json"
    except OSError:              # the file vanished or cannot be read again: check, do not cache
        return None


def _read(entry: Path | None) -> dict | None:
    """The recorded outcome, or None when there is none or it is not one (a truncated or edited
    file is recomputed and rewritten, never trusted)."""
    if entry is None:
        return None
    try:
        d = json.loads(entry.read_text())
        kl, kl4, refused = d["kl"], d["kl_int4"], d["refused"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = (d.get("key") == entry.stem and isinstance(refused, bool)
          and all(isinstance(v, float) and math.isfinite(v) for v in (kl, kl4)))
    return {"kl": kl, "kl_int4": kl4, "refused": refused} if ok else None


def _write(entry: Path | None, out: dict) -> None:
    """Record the outcome (write then rename, so a reader never sees half a file); a home that
    cannot be written to only means the next load checks again."""
    if entry is None:
        return
    tmp = entry.with_name(f"{entry.stem}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": entry.stem, **out}, indent=1))
        os.replace(tmp, entry)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return
    _prune(entry.parent)


def _prune(folder: Path) -> None:
    """Keep the CACHE_KEEP newest entries: each edit of minfer's source, each moved or rewritten
    file leaves an entry no key will name again (a pruned one that was still wanted costs one check)."""
    try:
        old = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime_ns)[:-CACHE_KEEP]
        for f in old:
            f.unlink(missing_ok=True)
    except OSError:              # another load pruning at the same time, or a read-only folder
        pass
