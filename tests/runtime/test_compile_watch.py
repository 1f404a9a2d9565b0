"""runtime/compile_watch.py: the Triton JIT hooks' accounting and the one note, driven by
calling the hooks as Triton does (triton/runtime/jit.py _do_compile: the cache hook before a
specialization is compiled or loaded, the post-compile hook after). The GPU test
(tests/gpu/test_compile_watch_gpu.py) has Triton itself call them."""
from __future__ import annotations

import io
import threading
import time

import pytest

from minfer.commands.run import format_timings
from minfer.runtime.compile_watch import CompileWatch


def _prepare(w: CompileWatch, seconds: float) -> None:
    assert w.before(key=("k",), repr="k") is None     # None: Triton goes on and compiles
    time.sleep(seconds)
    w.after(key=("k",), repr="k")


def test_fast_loads_are_counted_without_a_note():
    out = io.StringIO()
    w = CompileWatch(stream=out, note_after_s=0.05, slow_s=0.2)
    for _ in range(3):
        _prepare(w, 0.0)
    assert (w.count, w.slow, w.noted) == (3, 0, False)
    assert 0.0 <= w.seconds < 0.2
    assert out.getvalue() == ""


def test_one_note_once_the_compiles_add_up():
    out = io.StringIO()
    w = CompileWatch(stream=out, note_after_s=0.1, slow_s=0.03, cache_dir="/somewhere/cache")
    _prepare(w, 0.0)                     # a cache load: not a compile
    _prepare(w, 0.06)                    # a compile, 0.06 s of compiling so far: no note yet
    assert out.getvalue() == ""
    _prepare(w, 0.06)                    # 0.12 s: the note
    _prepare(w, 0.06)
    note = out.getvalue()
    assert note.count("\n") == 1 and note.startswith("minfer: compiling GPU kernels")
    assert "/somewhere/cache" in note
    assert (w.count, w.slow) == (4, 3)
    assert w.slow_seconds >= 0.18 and w.seconds >= w.slow_seconds


def test_a_quiet_watch_counts_but_prints_nothing():
    w = CompileWatch(stream=None, note_after_s=0.01, slow_s=0.01)
    _prepare(w, 0.02)
    assert (w.count, w.slow, w.noted) == (1, 1, False)


def test_chained_hooks_are_called_and_a_skip_is_passed_on():
    calls = []
    w = CompileWatch(note_after_s=10)
    w._prev_before = lambda **kw: calls.append(("before", kw["key"])) or None
    w._prev_after = lambda **kw: calls.append(("after", kw["key"]))
    _prepare(w, 0.0)
    assert calls == [("before", ("k",)), ("after", ("k",))] and w.count == 1
    # a hook before ours that returns True tells Triton to skip the compile (no post hook follows):
    # the watch returns it and leaves nothing open
    w._prev_before = lambda **kw: True
    assert w.before(key=("k2",)) is True
    w._prev_after = None
    w.after(key=("k2",))                 # (a stray post hook: nothing open, nothing counted)
    assert w.count == 1


def test_compiles_in_two_threads_are_timed_apart():
    w = CompileWatch(note_after_s=10)
    ts = [threading.Thread(target=_prepare, args=(w, 0.05)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert w.count == 2
    assert 0.1 <= w.seconds < 0.5        # each its own ~0.05 s, not the sum of overlapping starts


@pytest.mark.parametrize("cs, shown", [(0.0, False), (0.4, False), (35.25, True)])
def test_the_timing_line_says_the_compile_seconds_and_ends_in_finish(cs, shown):
    line = format_timings({"prompt_tokens": 5, "prompt_s": 30.0, "gen_tokens": 64, "gen_s": 8.0,
                           "compile_s": cs}, "stop")
    assert line.endswith("| finish: stop")
    assert ("35.2 s of it compiling GPU kernels" in line) is shown
    assert ("compiling" in line) is shown


def test_install_sets_tritons_hooks_once_or_says_none_without_triton():
    from minfer.runtime import compile_watch

    try:
        from triton import knobs
    except ImportError:                  # (a CPU-only torch without Triton: nothing to watch)
        assert compile_watch.install(None) is None and compile_watch.seconds() == 0.0
        return
    w = compile_watch.install(None)
    assert w is compile_watch.install(None) is compile_watch.current()
    assert knobs.runtime.jit_cache_hook == w.before and knobs.runtime.jit_post_compile_hook == w.after
