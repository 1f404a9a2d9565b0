"""`minfer serve -np N`'s batch flags as a new user gets them wrong: a KV pool too small for one
sequence or for N of them, a token budget below N, a pool larger than the memory. Each is one
line before the server starts (these were refused by the background load after the socket
was open, or served silently with answers cut short at what the pool held).

The port is held by the test, so a run that gets past the checks ends at once with "cannot
listen": the checks are proven to come before the server starts. The tiny synthetic model stands
in for a real one; its KV cache is sized here from its header, not by the code under test."""

from __future__ import annotations

import socket

import pytest

from helpers_cli import kv_block_bytes, one_error_line, write_tiny_model

from minfer import cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("fhs"))


@pytest.fixture(scope="module")
def block_bytes(tiny):
    return kv_block_bytes(tiny)


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield str(s.getsockname()[1])


def serve_line(capsys, tiny, port, *flags) -> str:
    return one_error_line(capsys, ["serve", "-m", tiny, "--device", "cpu", "--port", port, *flags])


def test_a_pool_without_one_block_is_one_line_naming_what_it_needs(capsys, tiny, busy_port, block_bytes):
    line = serve_line(capsys, tiny, busy_port, "-np", "4", "--kv-memory", "1k")
    # the tiny model's default context: its trained 2048 tokens = 128 blocks, plus the padding block
    assert line.startswith("minfer: error: --kv-memory 1K holds 0 KV blocks of 16 positions"), line
    assert "needs 128 blocks" in line and "-c/--ctx" in line, line
    suggested = line.split("give --kv-memory ")[1].split()[0]
    from minfer.commands.serve import parse_size

    # enough, and rounded up by no more than a few percent
    assert 129 * block_bytes <= parse_size(suggested) <= 1.05 * 129 * block_bytes, (suggested, block_bytes)
    # the size it suggests is enough: the checks pass and the run gets to the (busy) port
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "-np", "4", "--kv-memory", suggested)


def test_a_pool_shorter_than_the_context_is_refused_not_served_cut_short(capsys, tiny, busy_port, block_bytes):
    size = str(64 * block_bytes)      # 63 usable blocks = 1008 positions, under the 2048 context
    line = serve_line(capsys, tiny, busy_port, "-np", "2", "--kv-memory", size)
    assert "63 KV blocks" in line and "= 1008 tokens" in line and "(2048 tokens, -c/--ctx)" in line, line
    # a context the pool holds: accepted
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "-np", "2", "--kv-memory", size, "-c", "512")


def test_more_slots_than_blocks_is_refused(capsys, tiny, busy_port, block_bytes):
    size = str(32 * block_bytes)      # 31 usable blocks; a 256-token context needs 16
    line = serve_line(capsys, tiny, busy_port, "-np", "40", "--kv-memory", size, "-c", "256")
    assert line.startswith("minfer: error: -np 40: ") and "at most 31 sequences" in line, line
    assert "give -np 31 or less" in line, line
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "-np", "31", "--kv-memory", size, "-c", "256")


def test_a_token_budget_below_the_slots_or_zero_is_refused(capsys, tiny, busy_port):
    line = serve_line(capsys, tiny, busy_port, "-np", "8", "--token-budget", "4")
    assert "--token-budget 4 is below -np 8" in line and "give --token-budget 8 or more" in line, line
    # -np 0 on the CPU serves the batch engine's 4 slots
    line = serve_line(capsys, tiny, busy_port, "-np", "0", "--token-budget", "3")
    assert "--token-budget 3 is below -np 4" in line, line
    line = one_error_line(capsys, ["serve", "-m", "/no/model.gguf", "--token-budget", "0"])
    assert "--token-budget 0: expected" in line, line
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "-np", "8", "--token-budget", "8")


def test_a_default_pool_past_the_memory_is_refused(capsys, monkeypatch, tiny, busy_port, block_bytes):
    from minfer.commands import preflight

    # say 200 blocks are free: one context (128 blocks) fits, the default pool of -np 4 (4 x 128
    # + 1) does not; nor does a --kv-memory of 300 blocks
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 200 * block_bytes)
    line = serve_line(capsys, tiny, busy_port, "-np", "4", "-c", "2048")
    assert "-np 4 full contexts of 2048 tokens" in line and "16.0 MiB of cpu memory but 6.2 MiB" in line, line
    assert "which holds 1; give -np 1 or less" in line, line     # (200 - 1) // 128
    line = serve_line(capsys, tiny, busy_port, "-np", "4", "--kv-memory", str(300 * block_bytes))
    assert line.startswith("minfer: error: --kv-memory 9.4M: ") and "is available" in line, line
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "-np", "1", "-c", "2048")


def test_token_budget_with_one_request_at_a_time_warns(capsys, tiny, busy_port):
    assert cli.main(["serve", "-m", tiny, "--device", "cpu", "--port", busy_port, "--token-budget", "64"]) == 1
    err = capsys.readouterr().err
    assert "warning: --token-budget" in err and "changes nothing" in err, err


def test_serve_help_describes_batching_not_only_one_at_a_time(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    intro = capsys.readouterr().out.split("Example:")[0]
    # the description said "One request generates at a time" whatever -np was (the default on CUDA
    # batches); it says when each holds, and names the flags that size the batching
    assert "One request generates at a time" not in intro
    assert "With -np N" in intro and "--kv-memory" in intro and "--token-budget" in intro, intro
    assert '"slots": N' in intro, intro


def test_host_given_as_a_url_is_refused_before_the_model(capsys):
    # was "cannot listen on http://localhost:8080: Name or service not known", after the model check
    line = one_error_line(capsys, ["serve", "-m", "/no/model.gguf", "--host", "http://localhost"])
    assert line.startswith("minfer: error: --host http://localhost: expected an address") and "not a URL" in line


def test_log_level_takes_any_case(capsys, tiny, busy_port):
    # --log-level DEBUG was argparse's "invalid choice" (uvicorn's own --log-level takes either case)
    assert "cannot listen" in serve_line(capsys, tiny, busy_port, "--log-level", "DEBUG")


def test_the_readme_serve_example_waits_for_the_model_before_asking():
    # the example sent its request right after starting the server in the background: curl -s met a
    # closed port (or a 503 while loading) and printed nothing at all
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in readme.split("```")[1::2] if "minfer serve" in b and "curl" in b)
    lines = block.strip().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("minfer serve") and ln.rstrip().endswith("&"))
    ask = next(i for i, ln in enumerate(lines) if "/v1/chat/completions" in ln)
    assert any("/health" in ln and "until" in ln for ln in lines[start + 1:ask]), block


def test_a_pool_under_a_quarter_context_per_slot_warns(capsys, tiny, busy_port, block_bytes):
    # 31 usable blocks for 8 slots of a 256-token (16-block) context: 62 positions each, under 64
    size = str(32 * block_bytes)
    assert cli.main(["serve", "-m", tiny, "--device", "cpu", "--port", busy_port, "-np", "8", "--kv-memory", size,
                     "-c", "256"]) == 1
    err = capsys.readouterr().err
    assert "warning: -np 8 with --kv-memory 1M: 31 blocks give each sequence 62 positions" in err, err
    assert "--kv-memory 1.1M gives a quarter context each" in err, err     # 8 x 4 + 1 blocks
    assert err.strip().splitlines()[-1].startswith("minfer: error: cannot listen"), err   # a warning only
    # 7 slots: 70 positions each, over a quarter context: no warning
    assert cli.main(["serve", "-m", tiny, "--device", "cpu", "--port", busy_port, "-np", "7", "--kv-memory", size,
                     "-c", "256"]) == 1
    assert "warning" not in capsys.readouterr().err
