"""First-hour sweep (session 36): every `minfer` CLI command of a user's first hour run on every
tests/data/arch/*.gguf fixture. The failures found, each with the test that pins its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_cli import one_error_line

ARCH = Path(__file__).parent / "data" / "arch"
BITNET = str(ARCH / "bitnet.gguf")   # SentencePiece vocab without byte tokens and without '<'


def test_run_chat_blames_the_fallback_format_not_the_users_text(capsys):
    # `run --chat -p hello` on a base model whose vocab cannot spell '<': the error used to be
    # "the text holds a character the vocab lacks ('<')" although "hello" holds no '<'
    line = one_error_line(capsys, ["run", "-m", BITNET, "-p", "hello", "-n", "1", "--device", "cpu",
                                   "--chat"])
    assert line.startswith("minfer: error: ") and BITNET in line, line
    assert "fallback chatml chat format" in line and "'<'" in line and "--raw" in line, line


def test_a_character_the_user_typed_is_still_blamed_on_the_text(capsys):
    line = one_error_line(capsys, ["run", "-m", BITNET, "-p", "hi<", "-n", "1", "--device", "cpu",
                                   "--chat"])
    assert "the text holds a character the vocab lacks ('<')" in line and "chat format" not in line, line


def test_chat_token_ids_names_the_chat_format():
    # the server's /v1/chat/completions and Engine.chat go through chat_token_ids
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer.chat_template import chat_token_ids
    from minfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(BITNET))
    with pytest.raises(MinferError, match=r"fallback chatml chat format .* holds '<'"):
        chat_token_ids(tok, [{"role": "user", "content": "hello"}])


@pytest.mark.parametrize("name", ["mamba", "laguna-elem"])
def test_bench_runs_attention_free_and_per_layer_head_count_models(capsys, name):
    # `minfer bench` died in ModelStats.from_gguf: ZeroDivisionError for Mamba (head_count 0),
    # TypeError for Laguna (head_count is a per-layer list)
    from minfer import cli

    rc = cli.main(["bench", "-m", str(ARCH / f"{name}.gguf"), "--device", "cpu", "-p", "4", "-n", "2",
                   "-r", "1", "--no-progress"])
    out = capsys.readouterr()
    assert rc in (0, None) and "Traceback" not in out.err, out.err
    assert "pp4" in out.out and "tg2" in out.out, out.out


def test_bench_attention_flops_sum_the_per_layer_heads():
    from minfer.bench.bench import ModelStats
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(str(ARCH / "laguna.gguf"))
    heads = gf.arch_get("attention.head_count")
    st = ModelStats.from_gguf(gf)
    assert isinstance(heads, list) and st.attn_heads == sum(heads) and st.n_head == max(heads)
    causal = 4 * 5 / 2 * 4 * sum(heads) * st.head_dim           # n = 4, no depth
    assert st.pp_flops(4, 0) - st.pp_flops(0, 0) == pytest.approx(2.0 * 4 * st.layer_params + causal)
    mamba = ModelStats.from_gguf(GGUFFile(str(ARCH / "mamba.gguf")))
    assert mamba.attn_heads == 0 and mamba.pp_flops(4, 0) == 2.0 * 4 * mamba.layer_params + 2.0 * mamba.head_params


def test_serve_refuses_a_ctx_past_the_learned_position_table_at_once(capsys):
    # `serve -m gpt2.gguf -c 256` (128 positions) warned "text beyond that length may degrade",
    # opened the socket and printed "serving ...", then the background load failed and /health
    # never came up; now the preflight refuses it before anything is served
    from minfer import cli

    rc = cli.main(["serve", "-m", str(ARCH / "gpt2.gguf"), "--device", "cpu", "-c", "256", "--port", "1"])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert rc == 1 and line.startswith("minfer: error: ") and "gpt2.gguf" in line, err
    assert "position_embd.weight" in line and "--ctx 128 or less" in line, line
    assert "may degrade" not in err and "serving" not in err, err


def test_run_refuses_a_ctx_past_the_position_table_without_the_may_degrade_warning(capsys):
    from minfer import cli

    rc = cli.main(["run", "-m", str(ARCH / "starcoder.gguf"), "--device", "cpu", "-c", "200", "-p", "hello",
                   "-n", "1", "--raw"])
    err = capsys.readouterr().err
    assert rc == 1 and "may degrade" not in err and "--ctx 128 or less" in err, err


def test_perplexity_names_the_text_file_and_line_a_vocab_cannot_spell(capsys, tmp_path):
    # the error named only the model ("bitnet.gguf: the text holds a character the vocab lacks
    # ('j')"), not the -f file the character is in
    f = tmp_path / "t.txt"
    f.write_text("a b c " * 3 + "jump", encoding="utf-8")   # (this vocab has no newline either)
    line = one_error_line(capsys, ["perplexity", "-m", BITNET, "-f", str(f), "--device", "cpu", "-c", "8"])
    assert line.startswith(f"minfer: error: {f}, line 1: ") and "('j')" in line and BITNET in line, line
