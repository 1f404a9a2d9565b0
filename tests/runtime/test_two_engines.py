"""Two engines of two different models in one process each give the greedy output they give
alone: nothing (switches, workspace, cache, graphs) is shared between engines."""

from __future__ import annotations

from minfer.gguf_file import GGUFFile
from minfer.models import load_model
from minfer.runtime.engine import Engine
from minfer.runtime.sampling import SamplingParams
from minfer.switches import Switches
from models.tiny import TinySpec, write_tiny_model

PROMPT = [3, 17, 42, 5, 9, 33, 1, 28]


def _engine(path, switches=None):
    return Engine(load_model(GGUFFile(path), progress=False), None, 64, switches=switches)


def _greedy(eng, n=12):
    return [ev.token_id for ev in eng.generate(PROMPT, SamplingParams(temperature=0), max_new_tokens=n)]


def test_two_engines_interleaved_match_alone(tmp_path):
    pa = write_tiny_model(tmp_path / "a.gguf", TinySpec(arch="llama", seed=11))
    pb = write_tiny_model(tmp_path / "b.gguf", TinySpec(arch="qwen2", seed=12, n_layers=3))
    alone_a = _greedy(_engine(pa))
    alone_b = _greedy(_engine(pb))
    assert alone_a != alone_b                       # two different models, or the test proves nothing
    a = _engine(pa, Switches(prefill_chunk=3))
    b = _engine(pb)
    assert a.switches.prefill_chunk == 3 and b.switches.prefill_chunk == 0
    ga = a.generate(PROMPT, SamplingParams(temperature=0), max_new_tokens=12)
    gb = b.generate(PROMPT, SamplingParams(temperature=0), max_new_tokens=12)
    got_a, got_b = [], []
    for ea, eb in zip(ga, gb):                      # one token of each, alternately
        got_a.append(ea.token_id)
        got_b.append(eb.token_id)
    assert got_a == alone_a and got_b == alone_b


def test_retired_switch_is_named_at_load(tmp_path, monkeypatch, capsys):
    from minfer.gguf_file import GGUFFile as G

    p = write_tiny_model(tmp_path / "a.gguf", TinySpec(arch="llama", seed=11))
    monkeypatch.setenv("MINFER_GROUP_FFN", "1")
    import minfer.runtime.engine as E

    monkeypatch.setattr(E, "load_tokenizer", lambda gf: None)     # the tiny file has no vocabulary
    eng = E.Engine.load(G(p), ctx=32, progress=False)
    assert "MINFER_GROUP_FFN (retired: gate and up are dequantized apart" in capsys.readouterr().err
    assert eng.switches == Switches.from_env()                   # the retired name changes nothing
