"""Chat templates are untrusted programs: each hostile template ends in one TemplateError (a
MinferError) naming the file and "chat template", soon -- never a hang, a traceback, a crash
or a huge allocation; and legitimate templates still render exactly.

The loops, powers and repetitions below are the ones of issue 15 (each hung `minfer run
--chat` before), plus the other ways a Jinja template can build a huge value in one C-level
step (filters and str methods with a size argument, format widths, doubling through a
namespace). The server's side (a 400, and the server answering afterwards) is in
tests/server/test_bad_input.py.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from minfer import cli
from minfer.errors import MinferError
from minfer.tokenizer.chat_template import (CHATML_TEMPLATE, TemplateError, TemplateLimitError, TemplateLimits,
                                            render_chat)

MSGS = [{"role": "user", "content": "hi"}]
SOURCE = "evil.gguf: tokenizer.chat_template"

# name -> template; every one must end in a TemplateError
HOSTILE = {
    "nested_range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested_list": "{% set L = range(100000)|list %}{% for a in L %}{% for b in L %}{% endfor %}{% endfor %}",
    "big_power": "{% set n = 1 %}{{ (n+9)**(10**9) }}",
    "big_repeat": "{{ 'a'*10**9 }}",
    "list_repeat": "{{ [1]*10**9 }}",
    "recursive_macro": "{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}",
    "recursive_loop": "{% set x = [[1]] %}{% for m in x recursive %}{{ loop(x) }}{% endfor %}",
    "range_past_cap": "{{ range(10**9)|list }}",
    "zero_division": "{{ 1/0 }}",
    "undefined_call": "{{ nothing() }}",
    "squaring_int": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "doubling_string": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling_list": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "center_filter": "{{ 'a'|center(10**9) }}",
    "center_constant": "{{ 'a'|center(1000000000) }}",
    "str_center": "{{ 'a'.center(10**9) }}",
    "int_to_bytes": "{{ (1).to_bytes(10**9, 'big') }}",
    "join_huge": "{{ range(100000)|join('x'*100000) }}",
    "replace_empty": "{{ ('a'*100000)|replace('', 'b'*100000) }}",
    "indent_lines": "{{ ('\\n'*100000)|indent(100000) }}",
    "expandtabs": "{{ ('\\t'*100000).expandtabs(100000) }}",
    "printf_width": "{{ '%999999999d' % 1 }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_nested": "{{ '{:{}}'.format(1, 10**8) }}",
    "print_shared_refs": "{% set L = ['a'*100000]*10 %}{% set M = [L]*100000 %}{{ M }}",
    "batch_fill": "{{ [1]|batch(10**9, 'x')|list }}",
    "lipsum": "{{ lipsum(10**9) }}",
    "many_built": "{{ range(100000)|map('string')|map('center', 1000000)|list|length }}",
    "output_flood": "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
    "slow_loop": "{% for i in range(100000) %}{% for j in range(9) %}{{ (i ~ j)|replace('1','22')|length }}{% endfor %}{% endfor %}",
    "striptags_quadratic": "{{ ('<a>x</a> ' * 100000)|striptags }}",
    "striptags_method": "{{ (('<a>x</a> ' * 100000)|safe).striptags() }}",
    "markup_center": "{{ ('x'|safe).center(10**9) }}",
    "wordwrap_huge": "{{ ('a ' * 500000)|wordwrap(1) }}",
    "urlize_huge": "{{ ('a.com ' * 150000)|urlize }}",
    "deep_nesting": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    "syntax_error": "{% for %}",
    "raise_exception": "{{ raise_exception('bad role \x1b]0;title\x07') }}",
    # sandbox escapes: the sandbox refuses them (SecurityError), also a TemplateError
    "escape_class": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "escape_globals": "{{ raise_exception.__globals__['os'] }}",
    "escape_format": "{{ '{0.__class__.__init__.__globals__}'.format(messages) }}",
    "escape_mutation": "{% set _ = messages.append(1) %}",
}


class _Hang(Exception):
    pass


def _render_guarded(template: str, **kw) -> str:
    """render_chat with a hang guard: a render still running after 30 s fails the test (a
    guard against a regression that hangs CI, not a timing assertion)."""
    def alarm(signum, frame):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    try:
        return render_chat(template, MSGS, source=SOURCE, **kw)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_one_clear_error(name):
    with pytest.raises(TemplateError) as e:
        _render_guarded(HOSTILE[name])
    msg = str(e.value)
    assert isinstance(e.value, MinferError)
    assert msg.startswith(SOURCE + ": ") and "chat template" in msg, msg
    assert "\n" not in msg and msg.isprintable() and len(msg) < 1000, msg


@pytest.mark.parametrize("name,what", [
    ("nested_range", "loop iterations"), ("big_power", "bits"), ("big_repeat", "characters"),
    ("recursive_macro", "nested"), ("slow_loop", "ran past"), ("output_flood", "the output"),
])
def test_limits_say_which_limit(name, what):
    with pytest.raises(TemplateLimitError, match=what):
        _render_guarded(HOSTILE[name])


def test_error_text_from_the_template_is_escaped():
    with pytest.raises(TemplateError) as e:
        _render_guarded(HOSTILE["raise_exception"])
    assert "\x1b" not in str(e.value) and "\\x1b]0;title\\x07" in str(e.value)


def test_limits_are_parameters():
    # a tighter budget stops a loop a default budget lets run: the limits are the ones used
    t = "{% for i in range(5000) %}x{% endfor %}"
    assert len(_render_guarded(t)) == 5000
    with pytest.raises(TemplateLimitError, match="1,000 loop iterations"):
        _render_guarded(t, limits=TemplateLimits(iterations=1000))


def test_oversized_template_refused():
    with pytest.raises(TemplateError, match="characters, more than"):
        _render_guarded("x" * (TemplateLimits().template_chars + 1))


def test_legitimate_templates_still_render():
    # ChatML by hand, the output written out independently of the renderer
    out = _render_guarded(CHATML_TEMPLATE)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # the features real templates use: loops with loop.*, namespace, tojson, filters, macros
    t = ("{% set ns = namespace(n=0) %}{% macro tag(x) %}<{{ x|upper }}>{% endmacro %}"
         "{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ tag(m.role) }}{{ m.content|trim }}"
         "{% if not loop.last %},{% endif %}{% endfor %}|{{ ns.n }}|{{ {'a': [1, 'é']}|tojson }}"
         "|{{ '%s-%d' % ('x', 3) }}|{{ '{}!'.format('y') }}|{{ messages|map(attribute='role')|join('+') }}")
    msgs = [{"role": "user", "content": " a "}, {"role": "assistant", "content": "b"}]
    assert render_chat(t, msgs) == '<USER>a,<ASSISTANT>b|2|{"a": [1, "é"]}|x-3|y!|user+assistant'


def test_a_long_conversation_fits_the_budget():
    # 2,000 messages of 1,000 characters: far past any real chat, well inside the limits
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "w" * 1000} for i in range(2000)]
    out = render_chat(CHATML_TEMPLATE, msgs)
    assert out.count("<|im_start|>") == 2001 and len(out) > 2_000_000


# ---- the command line -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_parts(tmp_path_factory):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    from test_fuzz_gguf import take_apart

    path = write_synth(tmp_path_factory.mktemp("hostile") / "base.gguf", get_preset("tiny"), "q8_0",
                       progress=False).path
    return take_apart(path)


def _with_template(parts, template: str, path: Path) -> Path:
    from gguf import GGUFValueType as VT

    from test_fuzz_gguf import serialize

    kvs, tensors, data = parts
    kvs = [(k, t, template if k == "tokenizer.chat_template" else v) for k, t, v in kvs]
    assert any(k == "tokenizer.chat_template" and t == VT.STRING for k, t, _ in kvs)
    path.write_bytes(serialize(kvs, tensors, data))
    return path


@pytest.mark.parametrize("name", ["nested_range", "big_power", "big_repeat", "recursive_macro", "slow_loop"])
def test_cli_chat_with_hostile_template(name, tiny_parts, tmp_path, capsys):
    path = _with_template(tiny_parts, HOSTILE[name], tmp_path / f"{name}.gguf")
    rc = cli.main(["run", "-m", str(path), "--device", "cpu", "-n", "1", "hi"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minfer: error: "), err
    assert str(path) in lines[0] and "chat template" in lines[0]
    assert "Traceback" not in err


def test_cli_chat_with_a_good_template_runs(tiny_parts, tmp_path, capsys):
    # the control for the test above: the same file with ChatML runs
    path = _with_template(tiny_parts, CHATML_TEMPLATE, tmp_path / "good.gguf")
    rc = cli.main(["run", "-m", str(path), "--device", "cpu", "-n", "1", "hi"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "finish:" in err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
