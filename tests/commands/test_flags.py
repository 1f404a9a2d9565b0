"""llama.cpp's flags where they mean the same thing, on every command that runs a model; errors
with the subcommand's usage; inspect -m. Parsing only (no model is loaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minfer import cli

MODEL_COMMANDS = ["run", "chat", "serve", "perplexity", "bench"]


def parse(argv):
    args, extra = cli.build_parser().parse_known_args(argv)
    assert extra == []
    return args


@pytest.mark.parametrize("cmd", MODEL_COMMANDS)
def test_shared_engine_flags(cmd):
    req = ["-f", "x.txt"] if cmd == "perplexity" else []
    a = parse([cmd, *req, "-m", "m.gguf", "-t", "3", "-ngl", "99", "--device", "cpu"])
    assert (a.model, a.threads, a.n_gpu_layers, a.device) == ("m.gguf", 3, 99, "cpu")
    assert parse([cmd, *req, "--threads", "1", "--n-gpu-layers", "0"]).threads == 1
    if cmd != "bench":   # bench sizes each test's context itself (llama-bench has no -c either)
        for flag in ("-c", "--ctx-size", "--ctx"):
            assert parse([cmd, *req, flag, "2048"]).ctx == 2048


@pytest.mark.parametrize("cmd", ["run", "chat"])
def test_generation_flags(cmd):
    a = parse([cmd, "-n", "7", "-s", "42", "--temp", "0"])
    assert (a.max_tokens, a.seed, a.temp) == (7, 42, 0.0)
    assert parse([cmd, "--n-predict", "9", "--seed", "1"]).max_tokens == 9
    assert parse([cmd, "--max-tokens", "3"]).max_tokens == 3
    # -ngl is its own flag, not -n with the value "gl" (issue 14)
    a = parse([cmd, "-ngl", "99"])
    assert a.n_gpu_layers == 99 and a.max_tokens == (256 if cmd == "run" else 512)


def test_run_prompt_and_mode_flags():
    a = parse(["run", "-p", "hello there", "-no-cnv"])
    assert a.prompt_opt == "hello there" and a.prompt is None and a.raw
    assert parse(["run", "--no-conversation", "x"]).raw and parse(["run", "--raw", "x"]).raw
    assert not parse(["run", "x"]).raw and not parse(["run", "x"]).chat
    assert parse(["run", "-cnv", "x"]).chat
    assert parse(["run", "-sys", "be brief", "x"]).system == "be brief"
    assert parse(["chat", "-p", "hi", "-sys", "S"]).first == "hi"


def test_perplexity_default_chunk_is_512():
    assert parse(["perplexity", "-f", "x"]).ctx == 512


def test_ngl_zero_means_cpu_without_device():
    from minfer.commands.common import device_from_args

    assert device_from_args(parse(["run", "-ngl", "0", "x"])) == "cpu"
    assert device_from_args(parse(["run", "-ngl", "99", "x"])) is None
    assert device_from_args(parse(["run", "-ngl", "0", "--device", "cuda", "x"])) == "cuda"


def _minfer(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "minfer", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_errors_print_the_subcommand_usage():
    r = _minfer("run", "--bogus", "x")
    assert r.returncode == 2
    assert r.stderr.startswith("usage: minfer run ") and "minfer run: error: unrecognized arguments: --bogus" in r.stderr
    r = _minfer("chat", "-n", "gl")
    assert r.returncode == 2 and r.stderr.startswith("usage: minfer chat ")
    assert "argument -n/--n-predict/--max-tokens: invalid int value: 'gl'" in r.stderr
    r = _minfer("serve", "--ctx-size")
    assert r.returncode == 2 and r.stderr.startswith("usage: minfer serve ")


def test_help_explains_the_llama_cpp_flags():
    r = _minfer("run", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for flag in ("-c N, --ctx-size N, --ctx N", "-t N, --threads N", "-ngl N, --n-gpu-layers N",
                 "-n N, --n-predict N", "-s SEED, --seed SEED", "-p PROMPT, --prompt PROMPT",
                 "--raw, -no-cnv, --no-conversation"):
        assert flag in text, flag
    assert "all layers go on the device chosen by --device" in text
    assert "physical cores" in text


def test_inspect_takes_m(capsys, tmp_path):
    # tests/commands is a package, so pytest puts tests/ on sys.path (as for tests/runtime)
    from models.tiny import TinySpec, write_tiny_model

    gguf = write_tiny_model(tmp_path / "tiny.gguf", TinySpec())
    assert cli.main(["inspect", "-m", str(gguf)]) == 0
    by_m = capsys.readouterr().out
    assert cli.main(["inspect", str(gguf)]) == 0
    assert capsys.readouterr().out == by_m and "architecture" in by_m
    assert cli.main(["inspect"]) == 1
    assert "give the model once" in capsys.readouterr().err


def test_threads_default_is_the_physical_cores():
    from minfer.commands.common import physical_cores, resolve_threads

    # independent count: lscpu's (core, socket) pairs of the CPUs this process may use
    r = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail("lscpu is not available")
    allowed = os.sched_getaffinity(0)
    pairs = {tuple(line.split(",")[1:3]) for line in r.stdout.splitlines()
             if line and not line.startswith("#") and int(line.split(",")[0]) in allowed}
    assert physical_cores() == len(pairs)
    old = os.environ.pop("MINFER_THREADS", None)
    try:
        assert resolve_threads(parse(["run", "x"])) == len(pairs)
        os.environ["MINFER_THREADS"] = "1"
        assert resolve_threads(parse(["run", "x"])) == 1
        assert resolve_threads(parse(["run", "-t", "2", "x"])) == 2   # the flag wins
    finally:
        os.environ.pop("MINFER_THREADS", None)
        if old is not None:
            os.environ["MINFER_THREADS"] = old


def test_omp_passive_wait_is_set_before_torch_starts():
    code = ("import os, sys; from minfer import cli; cli.set_process_env(); import torch; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "PASSIVE", r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert r.stdout.strip() == "ACTIVE"   # a user's own setting is kept
    late = "import torch, os; from minfer import cli; cli.set_process_env(); print(os.environ.get('OMP_WAIT_POLICY'))"
    r = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "None"     # too late once torch is loaded: not pretended
