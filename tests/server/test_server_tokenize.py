"""POST /tokenize and /detokenize (minfer/server/token_routes.py) on the real SmolLM2-135M, in vLLM's and
llama.cpp's request shapes. The reference is llama.cpp's own tokenizer: tests/tokenizer/goldens/
smollm2-135m-instruct.json holds, for each text, llama_tokenize(add_special=true, parse_special=true) (`ids`),
llama_detokenize with the special tokens' text (`decode`) and llama_token_to_piece of every token used
(`pieces_hex`). The chat form must give the ids /v1/chat/completions runs (its usage.prompt_tokens and the
ids of tokenizer.chat_template's chat_token_ids)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from minfer.tokenizer.chat_template import chat_token_ids

_GOLD = Path(__file__).resolve().parents[1] / "tokenizer" / "goldens" / "smollm2-135m-instruct.json"
# tools/gen_token_goldens.py stores a large golden gzipped (<name>.json.gz), as tests/tokenizer/conftest.load_golden reads it
GOLDEN = json.loads(gzip.decompress(_GOLD.with_suffix(".json.gz").read_bytes()) if _GOLD.with_suffix(".json.gz").exists()
                    else _GOLD.read_text())
CASES = [c for c in GOLDEN["cases"] if c["text"]][:60] + [c for c in GOLDEN["cases"] if "<|im_start|>" in c["text"]][:5]


def post(srv, path, body, status=200):
    r = httpx.post(srv.url + path, json=body, timeout=600)
    assert r.status_code == status, r.text
    return r.json()


def test_text_ids_are_llama_cpps(server):
    """vLLM's `prompt` (add_special_tokens defaults to true) and llama.cpp's `content` give llama.cpp's ids of
    tokenize(add_special=true, parse_special=true) (SmolLM2 adds no BOS, so add_special changes nothing here),
    control-token texts as tokens; count and max_model_len as vLLM answers them."""
    for c in CASES:
        a = post(server, "/tokenize", {"prompt": c["text"]})
        assert a["tokens"] == c["ids"], c["text"]
        assert a["count"] == len(c["ids"]) and a["max_model_len"] == 512 and a["token_strs"] is None
        b = post(server, "/tokenize", {"content": c["text"], "add_special": True})
        assert b["tokens"] == c["ids"]


def test_pieces_and_token_strs(server, engine):
    """llama.cpp's with_pieces: each id with llama_token_to_piece's text (bytes as a list where not whole UTF-8);
    vLLM's return_token_strs: the vocabulary's strings."""
    ph = GOLDEN["pieces_hex"]
    # golden texts whose every piece the golden holds, some of them pieces of a multi-byte character
    cases = [c for c in GOLDEN["cases"] if c["text"] and all(str(i) in ph for i in c["ids"])]
    some = [c for c in cases if "你" in c["text"] or "😀" in c["text"]][:10] + cases[:20]
    partial = 0
    for c in some:
        out = post(server, "/tokenize", {"content": c["text"], "add_special": True, "with_pieces": True,
                                         "return_token_strs": True})
        ids = [t["id"] for t in out["tokens"]]
        assert ids == c["ids"], c["text"]
        for t in out["tokens"]:
            raw = bytes.fromhex(ph[str(t["id"])][0])
            try:
                assert t["piece"] == raw.decode("utf-8")
            except UnicodeDecodeError:
                assert t["piece"] == list(raw)
                partial += 1
        assert out["token_strs"] == [engine.tokenizer.token_text(i) for i in ids]
    assert partial > 0
    strs = post(server, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})["token_strs"]
    assert strs == ["Hello", "Ġworld"]                                        # the vocabulary's strings, not text


def test_detokenize_is_llama_cpps(server):
    for c in CASES:
        out = post(server, "/detokenize", {"tokens": c["ids"]})
        assert out["prompt"] == c["decode"] == out["content"], c["text"]


def test_chat_form_gives_the_chat_endpoints_ids(server, engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    out = post(server, "/tokenize", {"messages": messages})
    assert out["tokens"] == chat_token_ids(engine.tokenizer, messages)
    used = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0})
    assert used["usage"]["prompt_tokens"] == out["count"]
    no_prompt = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert no_prompt["tokens"] == chat_token_ids(engine.tokenizer, messages, add_generation_prompt=False)
    assert no_prompt["count"] < out["count"]


def test_refusals_name_the_field(server):
    def err(path, body):
        e = post(server, path, body, status=400)["error"]
        return e["param"], e["message"]

    assert err("/tokenize", {"prompt": "a", "content": "b"})[0] == "prompt"
    assert err("/tokenize", {})[0] == "prompt"
    assert err("/tokenize", {"prompt": "a", "max_tokens": 3}) == (
        "max_tokens", err("/tokenize", {"prompt": "a", "max_tokens": 3})[1])
    assert "max_tokens: not a field" in err("/tokenize", {"prompt": "a", "max_tokens": 3})[1]
    assert err("/tokenize", {"prompt": "a", "add_special": "yes"})[0] == "add_special"
    assert err("/tokenize", {"prompt": "a", "add_special": True, "add_special_tokens": True})[0] == "add_special"
    assert err("/tokenize", {"prompt": 7})[0] == "prompt"
    assert err("/tokenize", {"messages": []})[0] == "messages"
    assert err("/tokenize", {"messages": [{"role": "user", "content": "x"}], "temperature": 0})[0] == "temperature"
    assert err("/detokenize", {"tokens": [1, 10 ** 9]})[1].startswith("tokens: token id 1000000000 is outside")
    assert err("/detokenize", {"tokens": "abc"})[0] == "tokens"
    assert err("/detokenize", {"tokens": [1], "skip_special_tokens": True})[0] == "skip_special_tokens"
    r = httpx.post(server.url + "/tokenize", json={"model": "no-such-model", "prompt": "a"}, timeout=60)
    assert r.status_code == 404 and "no-such-model" in r.text


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_counted_in_the_metrics_under_their_names(server, path):
    post(server, path, {"prompt": "hi"} if path == "/tokenize" else {"tokens": [1, 2]})
    text = httpx.get(server.url + "/metrics", timeout=60).text
    assert f'endpoint="{path}"' in text
