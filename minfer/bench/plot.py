"""Recorded runs (bench/results/*.json) -> a PNG of tok/s by commit and test.

One panel for prefill (pp) tests and one for generation (tg); a line per (model, runner,
test), x = the runs in date order labelled by commit. matplotlib is optional
(`pip install 'minfer[plot]'`): without it the series are still built (and testable) and
plot_runs raises a MinferError saying what to install.
"""

from __future__ import annotations

import json
from pathlib import Path

from minfer.errors import MinferError


def load_runs(paths: list[str]) -> list[dict]:
    """The minfer-bench JSON records among `paths` (files, or folders searched for *.json)."""
    from minfer.bench.bench import FORMAT

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise MinferError(f"{p}: no such file or folder of recorded runs")
    runs = []
    for f in files:
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:   # ValueError: bad JSON, or bytes that are not UTF-8 (was a traceback)
            raise MinferError(f"{f}: not a readable JSON file: {e}") from e
        if isinstance(rec, dict) and rec.get("format") == FORMAT:
            bad = _record_problem(rec)
            if bad:   # (a hand-edited record was a KeyError or AttributeError traceback)
                raise MinferError(f"{f}: not a complete {FORMAT} record: {bad}")
            rec["_file"] = str(f)
            runs.append(rec)
    return sorted(runs, key=lambda r: r["machine"]["date"])


def _record_problem(rec: dict) -> str | None:
    """What a record lacks of the fields series() and plot_runs() read, or None."""
    m, model, results = rec.get("machine"), rec.get("model"), rec.get("results", [])
    if not isinstance(m, dict) or not isinstance(m.get("date"), str):
        return "machine.date (a string) is missing"
    if not isinstance(model, dict) or not isinstance(model.get("desc"), str):
        return "model.desc (a string) is missing"
    if not isinstance(results, list):
        return "results is not a list"
    for i, r in enumerate(results):
        if not isinstance(r, dict) or not all(isinstance(r.get(k), str) for k in ("runner", "test")) \
                or not all(isinstance(r.get(k), (int, float)) for k in ("avg_ts", "stdev_ts")):
            return f"results[{i}] needs runner and test (strings), avg_ts and stdev_ts (numbers)"
        if not isinstance(r.get("env", {}), dict):
            return f"results[{i}].env is not an object"
    return None


def series(runs: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """(model desc, runner, test) -> points [{x, label, date, avg_ts, stdev_ts}] in date order;
    x is the run's index in `runs`, label its short commit (+ '*' when dirty)."""
    out: dict[tuple[str, str, str], list[dict]] = {}
    for x, rec in enumerate(runs):
        m = rec["machine"]
        label = (m.get("commit") or "?")[:7] + ("*" if m.get("dirty") else "")
        for r in rec.get("results", []):
            if r.get("env", {}).get("ab_side"):
                continue   # A/B samples are judged as ratios, not plotted as levels
            key = (rec["model"]["desc"], r["runner"], r["test"])
            out.setdefault(key, []).append({"x": x, "label": label, "date": m["date"],
                                            "avg_ts": r["avg_ts"], "stdev_ts": r["stdev_ts"]})
    return out


def plot_runs(paths: list[str], out: str) -> int:
    """Write the PNG; returns the number of recorded runs plotted."""
    runs = load_runs(paths)
    if not runs:
        raise MinferError(f"no minfer bench records (*.json with \"format\": \"minfer-bench/1\") in "
                          f"{', '.join(paths)}")
    data = series(runs)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MinferError("plotting needs matplotlib, which is not installed: pip install "
                          "'minfer[plot]' (or pip install matplotlib); no plot written") from e
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), squeeze=False)
    for ax, kind, title in ((axes[0][0], "pp", "prefill (pp)"), (axes[0][1], "tg", "generation (tg)")):
        for (desc, runner, test), pts in sorted(data.items()):
            if not test.startswith(kind):
                continue
            ax.errorbar([p["x"] for p in pts], [p["avg_ts"] for p in pts],
                        yerr=[p["stdev_ts"] for p in pts], marker="o", capsize=3,
                        label=f"{desc} {test}" + ("" if runner == "minfer" else f" [{runner}]"))
        ax.set_title(title)
        ax.set_ylabel("tokens / s")
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([(r["machine"].get("commit") or "?")[:7] + "\n" + r["machine"]["date"][:10]
                            for r in runs], rotation=45,
                           ha="right", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    gpus = sorted({(r["machine"].get("gpu") or {}).get("name") or "CPU" for r in runs})
    fig.suptitle(f"minfer bench: tok/s by commit ({', '.join(gpus)})")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return len(runs)
