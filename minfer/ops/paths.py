"""Launch-path counters and fast-path switches of the CUDA backend.

Every kernel wrapper calls `count(path)` each time it takes a path (e.g.
`qmatmul.q4_K.prefill`), so that a path which silently fell back shows in the report.
Two kinds of detour read differently in the report:
- `switched_off(path, env)`: the user turned a fast path off (MINFER_GEMV=0 ...);
- `fallback(path, reason)`: the fast path could not take this input (a type without a kernel ...).

MINFER_DEBUG_PATHS=1 prints the report at interpreter exit (stderr). Counts are made in Python
at call time: a CUDA-graph replay launches kernels without calling the wrappers, so a
captured decode step is counted once, at capture (the report says how many replays ran
when the graph runner records them with `count('graph.decode.replay')`).

Switches are read from the environment at call time (not at import), so a benchmark's A/B
can flip them between runs in one process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections import Counter
from contextlib import contextmanager

_lock = threading.Lock()
_counts: Counter = Counter()
_off: Counter = Counter()          # (path, env) -> times a switch turned the fast path off
_fallbacks: Counter = Counter()    # (path, reason) -> times the fast path fell back


def enabled(env: str, default: bool = True) -> bool:
    """A fast-path switch: MINFER_X=0 (or false/off/no) turns it off; unset -> `default`."""
    v = os.environ.get(env)
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "off", "no")


def env_int(env: str, default: int) -> int:
    """An integer tuning knob read at call time (MINFER_GEMV_MAX_M=16 ...)."""
    v = os.environ.get(env)
    try:
        return int(v) if v not in (None, "") else default
    except ValueError:
        return default


def count(path: str, n: int = 1) -> None:
    with _lock:
        _counts[path] += n


def switched_off(path: str, env: str) -> None:
    """The fast path `path` was not taken because the user set `env`=0 (or, when `env`
    holds '=', the setting it names: 'MINFER_PREFILL_ATTN=flash')."""
    with _lock:
        _off[(path, env)] += 1


def fallback(path: str, reason: str) -> None:
    """The fast path `path` could not run on this input; `reason` says why."""
    with _lock:
        _fallbacks[(path, reason)] += 1


def snapshot() -> dict:
    """{'counts': {path: n}, 'switched_off': {'path (ENV=0)': n}, 'fallbacks': {'path: reason': n}}."""
    with _lock:
        return {
            "counts": dict(_counts),
            "switched_off": {f"{p} (switched off by {e if '=' in e else e + '=0'})": n
                             for (p, e), n in _off.items()},
            "fallbacks": {f"{p} (fell back because {r})": n for (p, r), n in _fallbacks.items()},
        }


def reset() -> None:
    with _lock:
        _counts.clear()
        _off.clear()
        _fallbacks.clear()


def report() -> str:
    snap = snapshot()
    lines = ["minfer launch paths (MINFER_DEBUG_PATHS=1):"]
    for p, n in sorted(snap["counts"].items()):
        lines.append(f"  {p}: {n}")
    for p, n in sorted(snap["switched_off"].items()):
        lines.append(f"  {p}: {n}")
    for p, n in sorted(snap["fallbacks"].items()):
        lines.append(f"  {p}: {n}")
    if len(lines) == 1:
        lines.append("  (no CUDA kernel paths ran)")
    return "\n".join(lines)


def _at_exit() -> None:
    if enabled("MINFER_DEBUG_PATHS", default=False):
        print(report(), file=sys.stderr)


atexit.register(_at_exit)


@contextmanager
def scoped_env(changes: dict):
    """Set (value) or unset (None) environment switches for the block, then restore them.
    Switches are read at call time, so this changes the paths taken inside the block."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
