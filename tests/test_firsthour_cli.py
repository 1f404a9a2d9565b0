"""A new user's first hour with the `minfer` command line: the mistakes they make (a typo'd model
name, an impossible flag, a directory where a file goes) each get one line naming what is wrong
and, where it can, what was meant -- never a traceback or a silently different run. The tiny
synthetic model stands in for a real one."""

from __future__ import annotations

import pytest

from minfer import cli


def one_error_line(capsys, argv, rc=1) -> str:
    """The last stderr line of `minfer ARGV`, which must exit with status rc (2: argparse's usage
    error, raised as SystemExit) and print no traceback."""
    try:
        got = cli.main(argv)
    except SystemExit as e:
        got = e.code
    out, err = capsys.readouterr()
    assert got == rc, (got, err)
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    return last


@pytest.mark.parametrize("typed,meant", [
    ("smolm2-135m-instruct", "smollm2-135m-instruct"),   # a letter dropped
    ("smollm2-135m", "smollm2-135m-instruct"),           # the start of a name
    ("qwen", "qwen2.5-coder-0.5b-instruct"),
    ("Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct"),
    ("smolm2", "smollm2-135m-instruct"),
])
def test_a_mistyped_model_name_suggests_the_catalog_name(capsys, typed, meant):
    for argv in (["run", "-m", typed, "hi"], ["inspect", typed], ["pull", typed]):
        line = one_error_line(capsys, argv)
        assert line.startswith("minfer: error: ") and f"Did you mean {meant}?" in line, line
    # named first, `ollama run` style: argparse's error carries the same hint
    line = one_error_line(capsys, ["run", typed, "hi"], rc=2)
    assert f"Did you mean {meant}?" in line, line


@pytest.mark.parametrize("typed", ["nope", "llama", "/no/such/dir/model.gguf"])
def test_no_suggestion_when_nothing_is_close(capsys, typed):
    line = one_error_line(capsys, ["run", "-m", typed, "hi"])
    assert "no such file" in line and "Did you mean" not in line, line
