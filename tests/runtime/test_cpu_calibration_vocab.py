"""The CPU int4 split's check on a vocab that cannot spell its calibration text
(minfer/runtime/cpu_calibration.calibration_ids): a SentencePiece vocab without byte tokens lacks a
character of CPU_CALIBRATION, and its tokenizer refuses the text. Before, that failed the whole CPU
load ("the text holds a character the vocab lacks ('O')") of a model whose user's text it can spell;
now the check runs on ids drawn from the vocab by a fixed seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from minfer.errors import MinferError
from minfer.runtime import cpu_calibration as C

ARCH = Path(__file__).resolve().parents[1] / "data" / "arch"


class Spells:
    def encode(self, text):
        return list(range(len(text.split())))


class Refuses:
    def encode(self, text):
        raise MinferError("x.gguf: the text holds a character the vocab lacks ('O')")


def test_ids_are_the_text_when_the_vocab_spells_it():
    assert C.calibration_ids(Spells(), 1000) == list(range(len(C.CPU_CALIBRATION.split())))[:96]


def test_ids_from_the_vocab_when_it_cannot_spell_it():
    a, b = C.calibration_ids(Refuses(), 320), C.calibration_ids(Refuses(), 320)
    assert a == b and len(a) == 96 and all(0 <= i < 320 for i in a) and len(set(a)) > 50


def test_a_vocab_without_the_text_still_loads_on_the_cpu(tmp_path, monkeypatch):
    """The bitnet fixture's tiny SentencePiece vocab has no 'O' and no byte tokens: the default CPU
    load (int4 split checked) used to fail on the calibration text; it loads and generates now."""
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    path = ARCH / "bitnet.gguf"
    tok_err = None
    eng = Engine.load(str(path), device="cpu", progress=False, switches=Switches(cpu_quant=True))
    try:
        eng.tokenizer.encode(C.CPU_CALIBRATION)
    except MinferError as e:
        tok_err = e
    assert tok_err is not None, "the fixture's vocab spells the calibration text: this test no longer tests the rule"
    ids = eng.tokenizer.encode("hello")
    out = [ev.token_id for ev in eng.generate(ids, max_new_tokens=3, temperature=0)]
    assert len(out) == 3
    assert any(w.packed is not None for w in eng.model.qweights())


def test_the_rule_is_needed(monkeypatch, tmp_path):
    """Without it (the text encoded as before) the same load fails naming the missing character."""
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(C, "calibration_ids", lambda tok, v: tok.encode(C.CPU_CALIBRATION)[:96])
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    with pytest.raises(MinferError, match="lacks"):
        Engine.load(str(ARCH / "bitnet.gguf"), device="cpu", progress=False, switches=Switches(cpu_quant=True))
