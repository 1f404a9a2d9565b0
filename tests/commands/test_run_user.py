"""`minfer run` as a user meets it (issue 14): chat by default, --raw, the finish reasons, and the
checks made before any slow work. The smallest real model, through the CLI's main()."""

from __future__ import annotations

import re

import pytest

from minfer import catalog, cli

SMOL = "smollm2-135m-instruct"


def timing(err: str) -> dict:
    m = re.search(r"prompt: (\d+) tokens .* generated: (\d+) tokens .* finish: (\w+)", err)
    assert m, err
    return {"prompt": int(m.group(1)), "generated": int(m.group(2)), "finish": m.group(3)}


def test_run_answers_through_the_chat_template_by_default(capsys):
    assert cli.main(["run", "-m", SMOL, "--temp", "0", "-n", "40", "What is the capital of France?"]) == 0
    out, err = capsys.readouterr()
    chat = timing(err)
    assert "Paris" in out
    assert chat["finish"] == "stop"          # the model ended its turn: an answer, not a loop
    assert cli.main(["run", "-m", SMOL, "--raw", "--temp", "0", "-n", "8", "What is the capital of France?"]) == 0
    raw_out, raw_err = capsys.readouterr()
    raw = timing(raw_err)
    # the template wraps the message in role markers (SmolLM2's adds a default system turn)
    assert raw["prompt"] == 7 and chat["prompt"] > raw["prompt"] + 10
    # llama.cpp's spellings of --raw do the same
    for flag in ("-no-cnv", "--no-conversation"):
        assert cli.main(["run", "-m", SMOL, flag, "--temp", "0", "-n", "8", "What is the capital of France?"]) == 0
        assert capsys.readouterr().out == raw_out


def test_prompt_flag_and_system_prompt(capsys):
    assert cli.main(["run", "-m", SMOL, "--temp", "0", "-n", "8", "-p", "What is the capital of France?"]) == 0
    assert timing(capsys.readouterr().err)["prompt"] > 17
    assert cli.main(["run", "-m", SMOL, "--raw", "-sys", "x", "hi"]) == 1
    assert "needs chat mode" in capsys.readouterr().err
    assert cli.main(["run", "-m", SMOL, "-p", "a", "b"]) == 1
    assert "give the prompt once" in capsys.readouterr().err


def test_n0_and_context_full_finish_reasons(capsys):
    assert cli.main(["run", "-m", SMOL, "--raw", "--temp", "0", "-n", "0", "The capital of France is"]) == 0
    t = timing(capsys.readouterr().err)
    assert (t["generated"], t["finish"]) == (0, "length")
    # -c 12 leaves room for 12 - 5 + 1 = 8 tokens: the context, not -n, ends the text
    assert cli.main(["run", "-m", SMOL, "--raw", "--temp", "0", "-c", "12", "-n", "-1",
                     "The capital of France is"]) == 0
    t = timing(capsys.readouterr().err)
    assert (t["prompt"], t["generated"], t["finish"]) == (5, 8, "context")
    assert cli.main(["run", "-m", SMOL, "--raw", "--temp", "0", "-c", "12", "-n", "100",
                     "The capital of France is"]) == 0
    assert timing(capsys.readouterr().err)["finish"] == "context"
    assert cli.main(["run", "-m", SMOL, "--raw", "--temp", "0", "-c", "64", "-n", "3",
                     "The capital of France is"]) == 0
    assert timing(capsys.readouterr().err)["finish"] == "length"


def test_impossible_ctx_is_one_line(capsys):
    assert cli.main(["run", "-m", SMOL, "-c", "100000000", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.match(r"minfer: error: -c/--ctx 100000000: the KV cache would need [\d.]+ TiB of cpu memory "
                    r"but [\d.]+ GiB is available; use -c \d+ or less", err)
    assert cli.main(["run", "-m", SMOL, "-c", "0", "hi"]) == 1
    assert "expected a positive number of tokens" in capsys.readouterr().err


def test_ctx_past_trained_length_warns(capsys):
    assert cli.main(["run", "-m", SMOL, "--raw", "-c", "9000", "-n", "1", "--temp", "0", "Hi"]) == 0
    err = capsys.readouterr().err
    assert "minfer: warning: -c/--ctx 9000 is past the 8192 tokens smollm2-135m-instruct.gguf was trained on" in err
    assert cli.main(["run", "-m", SMOL, "--raw", "-c", "8192", "-n", "1", "--temp", "0", "Hi"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_unrunnable_catalog_model_is_refused_before_the_download(capsys, monkeypatch, tmp_path):
    import dataclasses

    import minfer.models

    monkeypatch.setenv("MINFER_HOME", str(tmp_path))
    # a catalog entry whose architecture the models registry does not have (the catalog's own
    # models all run, or will: the check must follow the registry, not a list of its own)
    odd = dataclasses.replace(catalog.CATALOG[SMOL], name="test-rwkv", arch="rwkv7")
    monkeypatch.setitem(catalog.CATALOG, "test-rwkv", odd)
    assert "rwkv7" not in minfer.models.ARCHITECTURES
    pulled = []

    def fake_pull(name, force=False, quiet=False):
        pulled.append(name)
        raise catalog.MinferError(f"{name}: (test) pull called")

    monkeypatch.setattr(catalog, "pull", fake_pull)
    for cmd in (["run", "-m", "test-rwkv", "hi"], ["chat", "-m", "test-rwkv"], ["perplexity", "-m", "test-rwkv", "-f", __file__]):
        assert cli.main(cmd) == 1
        err = capsys.readouterr().err
        assert "test-rwkv: architecture 'rwkv7' cannot run in minfer yet" in err and "nothing was downloaded" in err
    assert pulled == [] and not (tmp_path / "models").exists()
    # once the registry has the architecture, the same command goes on to the download
    monkeypatch.setitem(minfer.models.ARCHITECTURES, "rwkv7", object)
    assert cli.main(["run", "-m", "test-rwkv", "hi"]) == 1
    assert pulled == ["test-rwkv"] and "(test) pull called" in capsys.readouterr().err


def test_threads_flag_sets_torch_threads(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert cli.main(["run", "-m", SMOL, "-t", "1", "--raw", "-n", "1", "--temp", "0", "Hi"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert cli.main(["run", "-m", SMOL, "-t", "0", "Hi"]) == 1
    assert "-t/--threads 0: expected at least 1 thread" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--top-p", "2"], ["--top-k", "-5"], ["--temp", "-1"], ["--min-p", "1.5"]])
def test_bad_sampling_values_are_one_line_errors(capsys, flags):
    assert cli.main(["run", "-m", SMOL, *flags, "Hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: ") and err.count("\n") == 1
    assert flags[0].lstrip("-").replace("-", "_") in err.replace("-", "_")
