"""Chat formats for GGUFs without tokenizer.chat_template (minfer/tokenizer/templates.py).

The expected texts follow llama.cpp's built-in renderings (src/llama-chat.cpp,
llm_chat_apply_template) of the same conversations.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer, render_chat
from minfer.tokenizer.templates import FORMATS, fallback_template

CONV = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi\n"},
        {"role": "assistant", "content": " Hello!"}, {"role": "user", "content": "Bye"}]


def _spm_vocab(tmp_path: Path, specials: list[str]) -> GGUFFile:
    """A vocab-only SentencePiece GGUF whose control tokens are `specials`."""
    tokens = ["<unk>", "<s>", "</s>", *specials, "▁", "▁a", "a", "b"]
    types = [2, 3, 3] + [3] * len(specials) + [1] * 4
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores([0.0] * len(tokens))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(tmp_path / "v.gguf")


def test_gemma_format_for_a_vocab_with_its_turn_markers(tmp_path):
    tok = Tokenizer.from_gguf(_spm_vocab(tmp_path, ["<start_of_turn>", "<end_of_turn>"]))
    assert tok.chat_template is None and tok.chat_format == "gemma"
    # llama.cpp: system text trimmed and put before the next user turn; contents trimmed;
    # 'assistant' becomes 'model'; the generation prompt opens a model turn
    assert tok.apply_chat_template(CONV) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert tok.apply_chat_template(CONV[1:2], add_generation_prompt=False) == \
        "<start_of_turn>user\nHi<end_of_turn>\n"
    # BOS, <start_of_turn> as one control token, then "▁a" (a space prefixed after it)
    assert tok.encode("<start_of_turn>a") == [1, 3, 6]


def test_vocab_without_markers_gets_chatml(tmp_path):
    tok = Tokenizer.from_gguf(_spm_vocab(tmp_path, []))
    assert tok.chat_format == "chatml"
    assert tok.apply_chat_template(CONV[1:2]) == "<|im_start|>user\nHi\n<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name, want", [
    ("phi3", "<|system|>\n Be brief. <|end|>\n<|user|>\nHi\n<|end|>\n<|assistant|>\n Hello!<|end|>\n"
             "<|user|>\nBye<|end|>\n<|assistant|>\n"),
    ("llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello!<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
])
def test_other_formats_render_as_llama_cpp(name, want):
    (markers, tmpl), = [(m, t) for n, m, t in FORMATS if n == name]
    assert fallback_template(set(markers)) == (name, tmpl)
    assert render_chat(tmpl, CONV, add_generation_prompt=True) == want


def _builtin_cases():
    from conftest import load_golden

    return load_golden("chat_builtin")["cases"]


@pytest.mark.parametrize("case", _builtin_cases(), ids=lambda c: f"{c['format']}-{len(c['messages'])}-"
                         f"{int(c['add_generation_prompt'])}")
def test_formats_equal_llama_cpps_builtin_renders(case):
    """goldens/chat_builtin.json: llama.cpp's own llama_chat_apply_template(<format>, ...) of each
    conversation (tools/gen_token_goldens.py --chat-builtin), with and without the generation
    prompt; minfer's Jinja form of the same format must give the same text."""
    (tmpl,) = [t for n, _, t in FORMATS if n == case["format"]]
    assert render_chat(tmpl, case["messages"], add_generation_prompt=case["add_generation_prompt"]) == case["text"]
