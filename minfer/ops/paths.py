"""Launch-path counters of the CUDA backend.

Every kernel wrapper calls `count(path)` each time it takes a path (e.g.
`qmatmul.q4_K.prefill`), so that a path which silently fell back shows in the report.
Two kinds of detour read differently in the report:
- `switched_off(path, env)`: the engine's Switches turned a fast path off (MINFER_GEMV=0 ...);
- `fallback(path, reason)`: the fast path could not take this input (a type without a kernel ...).

MINFER_DEBUG_PATHS=1 prints the report at interpreter exit (stderr). Counts are made in Python
at call time: a CUDA-graph replay launches kernels without calling the wrappers, so a
captured decode step is counted once, at capture (the report says how many replays ran
when the graph runner records them with `count('graph.decode.replay')`).

The switches themselves live in minfer/switches.py (one frozen object the engine owns); the
counters here are process-wide on purpose: they report what ran, whichever engine ran it.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()
_off: Counter = Counter()          # (path, env) -> times a switch turned the fast path off
_fallbacks: Counter = Counter()    # (path, reason) -> times the fast path fell back


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


def _default_off(env: str) -> bool:
    """A tuning switch whose default is off and that the environment does not set: the path it
    gates is off because nobody turned it on, not because someone turned it off."""
    from dataclasses import fields

    from minfer.process_env import environ_snapshot
    from minfer.switches import Switches

    if "=" in env or env in environ_snapshot():
        return False
    f = next((f for f in fields(Switches) if f.metadata["env"] == env), None)
    return f is not None and f.default in (False, 0)


def report() -> str:
    snap = snapshot()
    lines = ["minfer launch paths (MINFER_DEBUG_PATHS=1):"]
    for p, n in sorted(snap["counts"].items()):
        lines.append(f"  {p}: {n}")
    with _lock:
        off = dict(_off)
    for (p, e), n in sorted(off.items()):
        if _default_off(e):
            lines.append(f"  {p} (off by default: {e}=1 turns it on): {n}")
        else:
            lines.append(f"  {p} (switched off by {e if '=' in e else e + '=0'}): {n}")
    for p, n in sorted(snap["fallbacks"].items()):
        lines.append(f"  {p}: {n}")
    if len(lines) == 1:
        lines.append("  (no CUDA kernel paths ran)")
    envs = sorted({e.split("=")[0] for (_, e) in off if not _default_off(e)})
    if envs:                          # what each switch that turned a path off does (its field doc)
        from dataclasses import fields

        from minfer.switches import Switches

        docs = {f.metadata["env"]: f"{f.name}: {f.metadata['doc']}" for f in fields(Switches)}
        lines.append("switches that turned paths off:")
        lines += [f"  {e} ({docs.get(e, 'not a minfer switch')})" for e in envs]
    return "\n".join(lines)


def _at_exit() -> None:
    from minfer.errors import MinferError
    from minfer.switches import Switches

    try:
        on = Switches.from_env().debug_paths
    except MinferError:
        return
    if on:
        print(report(), file=sys.stderr)


atexit.register(_at_exit)

