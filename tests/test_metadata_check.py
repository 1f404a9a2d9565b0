"""minfer/metadata_check.py's key table against gguf-py's own key names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from gguf.constants import Keys

from minfer import metadata_check
from minfer.errors import MinferError


def _file(meta):
    return SimpleNamespace(path="m.gguf", metadata={"general.architecture": "llama", **meta}, tensors={})


def test_every_special_token_id_key_of_gguf_is_checked():
    # the *_token_id keys minfer reads (tokenizer/vocab.py _ID_KEYS), as gguf-py names them;
    # SEP_ID is spelled "seperator_token_id" there
    assert Keys.Tokenizer.SEP_ID == "tokenizer.ggml.seperator_token_id"
    for key in (Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID,
                Keys.Tokenizer.EOM_ID, Keys.Tokenizer.UNK_ID, Keys.Tokenizer.SEP_ID,
                Keys.Tokenizer.PAD_ID, Keys.Tokenizer.MASK_ID, Keys.Tokenizer.FIM_PRE_ID,
                Keys.Tokenizer.FIM_SUF_ID, Keys.Tokenizer.FIM_MID_ID, Keys.Tokenizer.FIM_PAD_ID,
                Keys.Tokenizer.FIM_REP_ID, Keys.Tokenizer.FIM_SEP_ID):
        assert key in metadata_check.TOKENIZER_KEYS, key


@pytest.mark.parametrize("key", ["tokenizer.ggml.seperator_token_id", "tokenizer.ggml.separator_token_id"])
def test_separator_id_of_the_wrong_type_is_refused(key):
    assert metadata_check.problems(_file({key: 102})) == {}
    bad = _file({key: "102"})
    assert metadata_check.problems(bad) == {key: "expected an integer token id, got a string"}
    with pytest.raises(MinferError, match=f"'{key}'"):
        metadata_check.check(bad, required=())


def test_block_count_may_count_absent_nextn_layers():
    """glm4moe/deepseek2 converters count the NextN (MTP) layers in block_count; a file without
    their tensors (llama.cpp glm4-moe.cpp: trunk_only) is accepted when nextn_predict_layers says so."""
    def f(meta):
        return SimpleNamespace(path="m.gguf", metadata={"general.architecture": "glm4moe", **meta},
                               tensors={"blk.0.attn_norm.weight": None, "blk.1.attn_norm.weight": None})

    key = "glm4moe.block_count"
    assert metadata_check.problems(f({key: 2})) == {}
    assert key in metadata_check.problems(f({key: 3}))
    assert metadata_check.problems(f({key: 3, "glm4moe.nextn_predict_layers": 1})) == {}
    assert key in metadata_check.problems(f({key: 3, "glm4moe.nextn_predict_layers": 2}))
    assert key in metadata_check.problems(f({key: 4, "glm4moe.nextn_predict_layers": 1}))
    bad = metadata_check.problems(f({key: 3, "glm4moe.nextn_predict_layers": -1}))
    assert "glm4moe.nextn_predict_layers" in bad
