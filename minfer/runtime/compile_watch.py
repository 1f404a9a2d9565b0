"""Triton's kernel compiles in this process, watched through its JIT hooks, so that a first run
on a fresh machine does not look hung or slow.

Triton calls `triton.knobs.runtime.jit_cache_hook` when a kernel specialization is launched for
the first time in a process (before it is compiled, or loaded from Triton's on-disk cache) and
`jit_post_compile_hook` once it is ready (triton/runtime/jit.py `_do_compile`, Triton 3.6). The
time between the two is a compile (seconds: every kernel of a model's shapes, the first time on
a machine) or a cache load (milliseconds). The watch adds them up and prints one note on stderr
once the compiles have taken a second; Engine.generate puts the seconds spent during a call in
`stats["compile_s"]`, which `minfer run` / `minfer chat` print beside their timings.

The hooks chain to any hook already set, and return what it returns (a truthy value from a
pre-compile hook tells Triton to skip the compile; the watch never returns one itself).
"""
from __future__ import annotations

import sys
import threading
import time

SLOW_S = 0.1          # a specialization ready later than this was compiled, not loaded from the cache (~ms)
NOTE_AFTER_S = 1.0    # the note once compiles have taken this long (an H100's first run: 26 kernels in 7.9 s)


class CompileWatch:
    """Counts and times the kernel specializations Triton prepares in this process."""

    def __init__(self, stream=None, note_after_s: float = NOTE_AFTER_S, cache_dir: str | None = None,
                 slow_s: float = SLOW_S):
        self.stream = stream              # where the one note goes (None: no note)
        self.note_after_s = note_after_s
        self.slow_s = slow_s
        self.cache_dir = cache_dir
        self.count = 0                    # specializations prepared (compiled or loaded)
        self.slow = 0                     # of which took slow_s or longer (compiled)
        self.slow_seconds = 0.0           # the time those took
        self.seconds = 0.0                # the time they all took
        self.noted = False
        self._lock = threading.Lock()
        self._local = threading.local()   # per thread: the start times of the compiles under way
        self._prev_before = None
        self._prev_after = None

    def _stack(self) -> list:
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def before(self, **kw):
        """Triton's jit_cache_hook: a specialization is about to be compiled or loaded."""
        if self._prev_before is not None:
            skip = self._prev_before(**kw)
            if skip:                      # the other hook asked Triton not to compile: no post hook follows
                return skip
        self._stack().append(time.perf_counter())
        return None

    def after(self, **kw):
        """Triton's jit_post_compile_hook: the specialization is ready."""
        if self._prev_after is not None:
            self._prev_after(**kw)
        st = self._stack()
        if not st:
            return None
        dt = time.perf_counter() - st.pop()
        with self._lock:
            self.count += 1
            self.seconds += dt
            slow = dt >= self.slow_s
            self.slow += slow
            self.slow_seconds += dt if slow else 0.0
            note = (slow and self.slow_seconds >= self.note_after_s and not self.noted
                    and self.stream is not None)
            self.noted = self.noted or note
        if note:
            where = f" in {self.cache_dir}" if self.cache_dir else ""
            print(f"minfer: compiling GPU kernels for this model's shapes: the first run on this machine "
                  f"takes a while; Triton keeps them{where}, so later runs start at once", file=self.stream,
                  flush=True)
        return None


_WATCH: CompileWatch | None = None
_INSTALL = threading.Lock()


def install(stream=sys.stderr) -> CompileWatch | None:
    """The process's watch, its hooks set on the first call (None where Triton is not
    installed). A stream given here (stderr by default) receives the note; None keeps the
    watch quiet (it still counts)."""
    global _WATCH
    with _INSTALL:
        if _WATCH is None:
            try:
                from triton import knobs
            except ImportError:
                return None
            try:
                cache_dir = knobs.cache.dir
            except Exception:             # (the cache's knobs have moved between Triton versions)
                cache_dir = None
            w = CompileWatch(cache_dir=cache_dir)
            w._prev_before = knobs.runtime.jit_cache_hook
            w._prev_after = knobs.runtime.jit_post_compile_hook
            knobs.runtime.jit_cache_hook = w.before
            knobs.runtime.jit_post_compile_hook = w.after
            _WATCH = w
        if stream is not None:
            _WATCH.stream = stream
        return _WATCH


def current() -> CompileWatch | None:
    """The installed watch, or None."""
    return _WATCH


def seconds() -> float:
    """The seconds Triton has spent preparing kernels in this process since install()."""
    return _WATCH.seconds if _WATCH is not None else 0.0
