"""A demanding new user's first hour with minfer (audit of 2026-12-05): what was wrong, each pinned.

- A stop string's tokens were listed in the logprobs of the answer that the stop string ended
  (completions' `tokens` spelled " 5, 6, 7, 8" for the text " 5, 6, 7, ", with a text_offset
  past the text's end), and a token whose text the engine held back (it might start a stop
  string) got the text_offset of the token before it. Now a token's logprob goes out with the
  text it made, and the stop string's tokens are dropped with the stop string (llama.cpp's
  server trims them too).
- A request's seed past 64 bits was a 400 with `param: null` whose message named the CLI's
  `--seed` flag; it is now the schema's 400 naming `seed`.
- `minfer serve --host ""` (an unset shell variable) listened on every interface; it is an error.
- A tensor of a ggml type minfer cannot decode (a file with an I32 or IQ2_XXS tensor) was
  "ggml type I32 is not supported by minfer", naming neither the file nor the tensor; and an
  error during a load with a progress bar (`minfer bench`) was written at the end of the bar's
  line, since the bar was never closed. `minfer inspect` listed such a type like any other; it
  marks it now (and --json lists it in unsupported_tensor_types).
- `minfer run -j FILE` and `minfer bench --plot DIR` with a file that is not UTF-8 were a
  UnicodeDecodeError traceback; a hand-edited bench record missing a field was a KeyError one.
- `minfer --help` had no example (every command's help has some).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from helpers_cli import one_error_line, write_tiny_model
from helpers_gguf import layout

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"


# ---- the logprobs of an answer describe its text (unit: the server's Accumulator) ----------

class _Tok:
    """The few tokenizer calls the Accumulator makes: each id's bytes, the end-of-turn ids."""

    def __init__(self, pieces: dict[int, str], eog=()):
        self.pieces, self.eog_ids = pieces, set(eog)

    def piece_bytes(self, tid: int) -> bytes:
        return self.pieces[tid].encode()


PIECES = {1: " ", 2: "5", 3: ",", 4: "6", 5: "7", 6: "8", 9: ""}


def _ev(tid, text, finish=None):
    return SimpleNamespace(token_id=tid, text=text, logprob=-0.5, top_logprobs=[(tid, -0.5)],
                           finish_reason=finish)


# the events the engine yields for "1, 2, 3, 4," greedy with stop ", 8," (smollm2-135m-instruct,
# printed from Engine.generate): text held back while it may start the stop string
HELD = [_ev(1, " "), _ev(2, "5"), _ev(3, ""), _ev(1, ""), _ev(4, ", 6"), _ev(3, ""), _ev(1, ""),
        _ev(5, ", 7"), _ev(3, ""), _ev(1, ""), _ev(6, ""), _ev(3, "", "stop")]


def _fold(events, chat, eog=()):
    from minfer.server.render import Accumulator

    acc = Accumulator(_Tok(PIECES, eog), 1, chat=chat)
    pieces = [acc.add(ev) for ev in events]
    return acc, [p for p in pieces if p is not None]


def test_completion_logprobs_of_a_stopped_answer_spell_its_text():
    acc, _ = _fold(HELD, chat=False)
    assert acc.text == " 5, 6, 7"
    toks = [e["token"] for e in acc.logprobs]
    assert "".join(toks) == acc.text, toks          # was " 5, 6, 7, 8,"
    offsets = [e["offset"] for e in acc.logprobs]
    assert offsets == [0, 1, 2, 3, 4, 5, 6, 7], offsets   # was 0, 1, 2, 2, 2, 5, 5, 5, 8, 8, 8, 8
    for tok, off in zip(toks, offsets):
        assert acc.text[off:off + len(tok)] == tok


def test_streamed_logprobs_go_out_with_their_text():
    _, pieces = _fold(HELD, chat=True)
    for text, entries in pieces:
        assert "".join(e["token"] for e in entries) == text, (text, entries)   # never "" + "8"


def test_single_token_stop_string_is_not_in_the_logprobs():
    events = [_ev(1, " "), _ev(2, "5"), _ev(3, ","), _ev(1, " "), _ev(6, "", "stop")]
    acc, _ = _fold(events, chat=True)
    assert [e["token"] for e in acc.logprobs] == [" ", "5", ",", " "]


def test_end_of_turn_and_length_keep_every_token():
    # an end-of-turn token (text "") keeps its entry, as before; so does a last token whose text
    # was still held back when the answer ran into max_tokens (its text is flushed with it)
    acc, _ = _fold([_ev(2, "5"), _ev(9, "", "stop")], chat=True, eog={9})
    assert [e["token"] for e in acc.logprobs] == ["5", ""]
    acc, _ = _fold([_ev(2, "5"), _ev(3, ""), _ev(1, ", ", "length")], chat=False)
    assert [e["token"] for e in acc.logprobs] == ["5", ",", " "] and acc.text == "5, "
    assert [e["offset"] for e in acc.logprobs] == [0, 1, 2]


# ---- the same through the server, on the real small model -----------------------------------

@pytest.fixture(scope="module")
def smol():
    from minfer.catalog import resolve_model
    from minfer.runtime.engine import Engine
    from minfer.server import create_app

    path = resolve_model("smollm2-135m-instruct")
    app = create_app(lambda: Engine.load(path, device="cpu", ctx=256, progress=False), served_name="smol")
    with TestClient(app) as c:
        deadline = time.monotonic() + 600   # hang guard, not a timing assertion
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model never loaded"
            time.sleep(0.05)
        yield c


def _events(r) -> list[dict]:
    lines = [ln[len("data: "):] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("stop", [", 8,", "8"])
def test_server_completion_logprobs_match_the_text_at_a_stop_string(smol, stop):
    body = {"prompt": "1, 2, 3, 4,", "max_tokens": 20, "temperature": 0, "stop": [stop], "logprobs": 1}
    r = smol.post(COMPL, json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text, lp = choice["text"], choice["logprobs"]
    assert choice["finish_reason"] == "stop" and stop not in text and "7" in text, choice
    assert "".join(lp["tokens"]) == text, (lp["tokens"], text)
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert text[off:off + len(tok)] == tok, (lp, text)
    streamed = _events(smol.post(COMPL, json={**body, "stream": True}))
    got = "".join(c["choices"][0]["text"] for c in streamed)
    toks = [t for c in streamed if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert got == text and "".join(toks) == text, (got, toks)


def test_server_chat_logprobs_match_the_content_at_a_stop_string(smol):
    body = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
            "max_tokens": 60, "temperature": 0, "stop": ["7"], "logprobs": True}
    choice = smol.post(CHAT, json=body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "6" in choice["message"]["content"], choice
    assert "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["message"]["content"]


# ---- a seed past 64 bits is the schema's 400 naming `seed` ------------------------------------

@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": [{"role": "user", "content": "hi"}]}), (COMPL, {"prompt": "hi"}),
])
@pytest.mark.parametrize("seed", [1 << 64, -(1 << 63) - 1, 1 << 70])
def test_a_seed_past_64_bits_is_a_400_naming_seed(smol, path, body, seed):
    r = smol.post(path, json={**body, "max_tokens": 1, "seed": seed})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "seed" and "seed" in err["message"] and "--seed" not in err["message"], err
    ok = smol.post(path, json={**body, "max_tokens": 1, "seed": (1 << 64) - 1})
    assert ok.status_code == 200, ok.text


# ---- a tensor type minfer cannot run names the file and the tensor ----------------------------

@pytest.fixture(scope="module")
def i32_model(tmp_path_factory):
    """The tiny model with its first norm's type id F32 (0) rewritten as I32 (26): the same 4
    bytes a value, a type minfer cannot decode."""
    import struct

    d = tmp_path_factory.mktemp("i32")
    path = write_tiny_model(d)
    at = layout(path)["type_at"]["blk.0.attn_norm.weight"]
    b = bytearray(open(path, "rb").read())
    assert struct.unpack_from("<I", b, at) == (0,)
    struct.pack_into("<I", b, at, 26)
    out = d / "i32.gguf"
    out.write_bytes(bytes(b))
    return str(out)


def test_an_unsupported_tensor_type_names_the_file_and_the_tensor(capsys, i32_model):
    line = one_error_line(capsys, ["run", "-m", i32_model, "--device", "cpu", "-n", "1", "hi"])
    assert line.startswith(f"minfer: error: {i32_model}: tensor 'blk.0.attn_norm.weight' has ggml type I32"), line
    assert "Q4_K" in line, line      # what it can run


def test_a_load_error_under_a_progress_bar_is_a_line_of_its_own(capsys, i32_model):
    # bench shows its loading bar also when stderr is not a terminal; the error was appended to it
    line = one_error_line(capsys, ["bench", "-m", i32_model, "--device", "cpu", "-p", "8", "-n", "0", "-r", "1"])
    assert line.startswith("minfer: error: "), repr(line)


# ---- `minfer serve --host ""` is refused, not every interface ---------------------------------

@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_not_every_interface(capsys, host):
    # the socket bound "" as 0.0.0.0: `--host "$HOST"` with HOST unset served the network
    line = one_error_line(capsys, ["serve", "-m", "/no/model.gguf", "--host", host])
    assert line.startswith("minfer: error: --host is empty") and "127.0.0.1" in line, line


def test_inspect_marks_a_tensor_type_minfer_cannot_run(capsys, i32_model):
    # inspect listed I32 like any other type; the load then stopped at that tensor
    from minfer import cli

    assert cli.main(["inspect", i32_model]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.split()[:1] == ["I32"]]
    assert len(row) == 1 and row[0].endswith("<-- minfer cannot run this type"), row
    assert cli.main(["inspect", i32_model, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unsupported_tensor_types"] == ["I32"]
    assert cli.main(["inspect", write_tiny_model(Path(i32_model).parent / "ok"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unsupported_tensor_types"] == []


# ---- run -j FILE with a file that is not UTF-8 ----------------------------------------------

def test_a_json_schema_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    # was a UnicodeDecodeError traceback (-f FILE, tokenize -f and perplexity -f said it in one line)
    bad = tmp_path / "schema.json"
    bad.write_bytes(b'\xa6{"type": "object"}')
    tiny = write_tiny_model(tmp_path)
    line = one_error_line(capsys, ["run", "-m", tiny, "--device", "cpu", "-j", str(bad), "-n", "1", "hi"])
    assert line.startswith(f"minfer: error: {bad}: ") and "not UTF-8" in line, line


def test_bench_plot_of_a_json_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    # was a UnicodeDecodeError traceback from bench/plot.py's load_runs
    (tmp_path / "run.json").write_bytes(b'\xa6{"format": 1}')
    line = one_error_line(capsys, ["bench", "--plot", str(tmp_path), "--plot-out", str(tmp_path / "p.png")])
    assert line.startswith(f"minfer: error: {tmp_path / 'run.json'}: not a readable JSON file"), line


@pytest.mark.parametrize("record,expect", [
    ({}, "machine.date"),
    ({"machine": {"date": "2026-12-05"}, "model": {"desc": "m"}, "results": [1]}, "results[0]"),
])
def test_bench_plot_of_an_incomplete_record_is_one_line(capsys, tmp_path, record, expect):
    # a hand-edited record was a KeyError / AttributeError traceback
    (tmp_path / "run.json").write_text(json.dumps({"format": "minfer-bench/1", **record}))
    line = one_error_line(capsys, ["bench", "--plot", str(tmp_path), "--plot-out", str(tmp_path / "p.png")])
    assert line.startswith(f"minfer: error: {tmp_path / 'run.json'}: not a complete minfer-bench/1 record") \
        and expect in line, line


def test_the_recorded_runs_are_complete_records():
    from minfer.bench.plot import load_runs

    assert load_runs([str(Path(__file__).parent.parent / "bench" / "results")])


# ---- `minfer --help` shows a first line to type ------------------------------------------------

def test_top_level_help_has_examples(capsys):
    # each command's help had examples, the top level none
    from minfer import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    examples = out.split("examples:\n", 1)[1].splitlines()
    assert any(ln.strip().startswith('minfer run "') for ln in examples), out
    assert any("minfer COMMAND --help" in ln for ln in examples), out
    assert max(len(ln) for ln in out.splitlines()) <= 100, out   # (the raw formatter does not wrap)
