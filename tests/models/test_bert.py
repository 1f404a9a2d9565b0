"""bert (BERT encoders, embeddings only: minfer/models/bert.py) on the fixtures tests/data/arch/bert and bert-mean
(tools/gen_bert_fixture.py: tiny random HF BertModels converted by llama.cpp's converter; bert-mean saved as a
sentence-transformers model with mean pooling, so its file carries bert.pooling_type).

References, none of them minfer's: transformers' last_hidden_state (<name>.npz: `hidden_<i>` the model as released,
HF's exact erf GELU; `hidden_tanh_<i>` the same weights with GELU's tanh form, which llama.cpp's graph computes) and
llama.cpp's token ids (bert.tokens.json). llama.cpp's own embeddings of both files are checked in
tests/runtime/test_embed.py (goldens.json). Here: the hidden rows against transformers, each rule shown needed,
generation refused with one clear message, bad files refused by name, the tokenizer against llama.cpp."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
NAMES = ["bert", "bert-mean"]
TOL_TANH = 1e-5      # against transformers with the tanh GELU: the same formula (measured <= 1e-6)
TOL_ERF = 1e-3       # against transformers as released (erf GELU): the formulas differ (measured <= 3.4e-4)
_ENGINES: dict = {}


def engine(name: str, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (name, tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(DATA / f"{name}.gguf", ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref(name: str) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """(ids, hidden erf, hidden tanh) of each input of the fixture's transformers reference."""
    z = np.load(DATA / f"{name}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"], z[f"hidden_tanh_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng, name: str, tanh: bool = True) -> float:
    """The largest miss over the fixture's inputs of eng's hidden rows (pooling none, not normalised)."""
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), ht if tanh else he) for ids, he, ht in ref(name))


@pytest.mark.parametrize("name", NAMES)
def test_layout(name):
    m = engine(name).model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.context_length) == \
        (2, 64, 4, 4, 16, 128, 128)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-12)
    assert m.position_embd.shape == (128, 64) and m.type_row.shape == (64,)
    assert len(m.qweights()) == 2 + 6 * len(m.blocks)
    assert c.pooling_type == (1 if name == "bert-mean" else -1)


@pytest.mark.parametrize("name", NAMES)
def test_hidden_rows_match_transformers(name):
    """Every input (3 texts, 40 and 100 random ids): within 1e-5 of transformers with the tanh GELU (llama.cpp's
    formula), within 1e-3 of transformers as released (erf GELU), and the two references are apart by more than
    the first tolerance (so the GELU form is what the tanh comparison tells)."""
    eng = engine(name)
    assert hidden_miss(eng, name, tanh=True) < TOL_TANH
    assert hidden_miss(eng, name, tanh=False) < TOL_ERF
    assert max(rel(he, ht) for _, he, ht in ref(name)) > 10 * TOL_TANH


def _causal(q, k, v, scale):
    T, H, Dh = q.shape
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                         is_causal=True, scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "no_positions", "no_token_type", "gelu_erf", "no_embd_norm_bias"])
def test_each_rule_is_needed(monkeypatch, what):
    """Bidirectional attention, the position table, token type 0's row, GELU's tanh form and the embedding norm's
    bias: with any one changed the hidden rows miss transformers' (tanh GELU) by more than 10x the tolerance
    (measured: causal 1.09, no positions 0.80, no type row 1.29, erf GELU 3.4e-4, no norm bias 0.36)."""
    import minfer.models.bert as bert
    from minfer import ops

    eng = engine("bert")
    m = eng.model
    assert hidden_miss(eng, "bert") < TOL_TANH
    if what == "causal":
        monkeypatch.setattr(bert, "bidirectional_attention", _causal)
    elif what == "no_positions":
        monkeypatch.setattr(m, "input_rows", lambda tokens, step: ops.embedding(tokens, m.token_embd).float()
                            + m.type_row)
    elif what == "no_token_type":
        monkeypatch.setattr(m, "type_row", None)
    elif what == "gelu_erf":
        monkeypatch.setattr(bert, "F", types.SimpleNamespace(
            gelu=lambda x, approximate: torch.nn.functional.gelu(x),
            scaled_dot_product_attention=torch.nn.functional.scaled_dot_product_attention))
    else:
        monkeypatch.setattr(m, "embd_norm_b", torch.zeros_like(m.embd_norm_b))
    assert hidden_miss(eng, "bert") > 10 * TOL_TANH
    if what == "gelu_erf":     # and with erf, transformers as released to the same 1e-5 (measured 8e-7)
        assert hidden_miss(eng, "bert", tanh=False) < TOL_TANH


def test_one_forward_whatever_the_prefill_chunk():
    """An encoder's input is not cut into prefill chunks (runtime/embed.py): with chunks of 3 the same rows; a step
    that does not start at position 0 is refused by name."""
    from minfer.models.base import Step

    eng = engine("bert", MINFER_PREFILL_CHUNK=3)
    assert eng.prefill_chunk() == 3
    assert hidden_miss(eng, "bert") < TOL_TANH
    with pytest.raises(MinferError, match="one forward from position 0"):
        eng.model.forward(torch.tensor([5, 6]), Step.at(3, 2, "cpu"), eng.cache, eng.ctx)


def test_pooled_vectors_of_the_files_pooling():
    """bert-mean's file pooling (mean) is the mean of the rows transformers gives."""
    eng = engine("bert-mean")
    for ids, _, ht in ref("bert-mean"):
        assert rel(eng.embed(ids, normalize=-1), ht.astype(np.float64).mean(0)) < TOL_TANH


def test_generation_is_refused_with_one_clear_message(capsys, monkeypatch):
    """Engine.logits / generate (the head's MinferError) and `minfer run` / chat / perplexity / bench (refused before
    the load): one line, no traceback; the model's head works again for an embedding afterwards."""
    from minfer.cli import main

    eng = engine("bert")
    msg = r"bert is an encoder \(bidirectional attention, no lm head\): it only embeds; use `minfer embed`"
    with pytest.raises(MinferError, match=msg):
        eng.logits([2, 50, 3])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([2, 50, 3], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    assert hidden_miss(eng, "bert") < TOL_TANH
    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    path = str(DATA / "bert.gguf")
    for cmd in (["run", "-m", path, "--device", "cpu", "hi"], ["chat", "-m", path, "--device", "cpu", "-p", "hi"],
                ["perplexity", "-m", path, "--device", "cpu", "-f", __file__], ["bench", "-m", path, "--device", "cpu"]):
        assert main(cmd) == 1
        err = capsys.readouterr().err
        assert err.splitlines() == [f"minfer: error: {path}: bert is an encoder (bidirectional attention, no lm head): "
                                    "it only embeds; use `minfer embed`, Engine.embed or the server's /v1/embeddings"], \
            (cmd, err)     # refused before the load (commands/preflight.py), no traceback


def test_minfer_embed_cli_reads_the_files_pooling(capsys, monkeypatch):
    """`minfer embed` on bert-mean: the file's mean pooling, unit vectors; on the CPU's default int8 path too
    (an encoder's matrices all int8, no int4 check: cosine with the float32 vector > 0.9995)."""
    from minfer.cli import main

    ids, _, ht = ref("bert-mean")[1]
    want = ht.astype(np.float64).mean(0)
    want /= np.linalg.norm(want)
    text = json.loads((DATA / "bert-mean.json").read_text())["texts"][1]
    for quant in ("0", "1"):
        monkeypatch.setenv("MINFER_CPU_QUANT", quant)
        assert main(["embed", "-m", str(DATA / "bert-mean.gguf"), "--device", "cpu", text]) == 0
        got = np.asarray(json.loads(capsys.readouterr().out.strip()), dtype=np.float64)
        if quant == "0":
            assert rel(got, want) < TOL_TANH
        else:
            assert float(got @ want) > 0.9995


def test_embed_cli_without_pooling_names_the_flag(capsys, monkeypatch):
    from minfer.cli import main

    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    assert main(["embed", "-m", str(DATA / "bert.gguf"), "--device", "cpu", "hi"]) == 1
    err = capsys.readouterr().err
    assert "bert.pooling_type is absent" in err and "give --pooling mean or cls" in err


def test_serve_takes_an_encoder_one_request_at_a_time():
    """`minfer serve`: -np 1 said once where it was not asked (CUDA's default batches), -np 2 refused by name."""
    from minfer.commands.serve import _one_at_a_time_if_unpaged
    from minfer.gguf_file import GGUFFile

    gf, said = GGUFFile(DATA / "bert.gguf"), []
    assert _one_at_a_time_if_unpaged(gf, None, 0, said.append) == 1
    assert said == ["architecture 'bert' runs one request at a time (-np 1): it is an encoder (embeddings only, "
                    "no KV cache)"]
    with pytest.raises(MinferError, match=r"-np 2: architecture 'bert' cannot run in the batch engine \(it is an "
                                          r"encoder"):
        _one_at_a_time_if_unpaged(gf, 2, 2, said.append)


def test_the_default_int8_path_reports_no_int4_check():
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    eng = Engine.load(DATA / "bert.gguf", ctx=128, progress=False, switches=Switches(cpu_quant=True))
    assert eng.cpu_quant_report == {"kl": None, "kl_int4": None, "refused": False, "cached": False,
                                    "int8_only": True}
    for ids, _, ht in ref("bert")[3:]:
        got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
        want = ht.astype(np.float64).mean(0)
        assert float(got @ want) / np.linalg.norm(want) > 0.9995


def test_context_past_the_position_table_is_refused():
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    with pytest.raises(MinferError, match=r"position table \(position_embd\.weight, bert\.context_length 128\)"):
        Engine.load(DATA / "bert.gguf", ctx=256, progress=False, switches=Switches(cpu_quant=False))


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("bert.attention.causal",)), "bert.attention.causal is absent: bert is an encoder"),
    (dict(drop_keys=("tokenizer.ggml.token_type_count",)), "'tokenizer.ggml.token_type_count' is missing"),
    (dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((192, 64))}), "'blk.0.attn_qkv.weight': a fused q/k/v"),
    (dict(drop_tensors=("position_embd.weight",)), "position_embd.weight"),
    (dict(drop_tensors=("token_embd_norm.bias",)), "token_embd_norm.bias"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused("bert", tmp_path, kw, match)


def test_a_causal_architecture_with_causal_false_is_still_refused(tmp_path):
    """Only a model class that declares causal = False takes attention.causal false (see also
    tests/runtime/test_embed.py test_a_non_causal_file_is_refused_by_name)."""
    import gguf

    from models.arch_checks import assert_refused

    assert_refused("starcoder", tmp_path, dict(set_keys={"starcoder.attention.causal": (False, gguf.GGUFValueType.BOOL)}),
                   "starcoder.attention.causal is false")


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_matches_llama_cpp(name):
    """llama.cpp's ids (Llama.tokenize: add_special puts [CLS] first and [SEP] last; parse_special on and off; and
    neither) of texts with accents, CJK, emoji, controls, special-token texts, odd spaces."""
    tok = engine(name).tokenizer
    rows = json.loads((DATA / "bert.tokens.json").read_text(encoding="utf-8"))["fixtures"][name]
    assert len(rows) >= 10
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    # the texts' ids in the transformers reference (its first inputs: HF's tokenizer) are llama.cpp's too
    texts = json.loads((DATA / f"{name}.json").read_text())["texts"]
    for (ids, _, _), t, r in zip(ref(name), texts, rows):
        assert r["text"] == t and ids == r["special"]
