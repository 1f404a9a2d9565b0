"""vLLM's prompt and output fields on /v1/chat/completions and /v1/completions
(minfer/server/prompting.py, minfer/tokenizer/continuation.py):
1. continue_final_message: the final assistant message is left open (exact prompt text and
   tokens with the real ChatML (SmolLM2), Qwen2.5 and gpt-oss templates and minfer's Llama 3
   format), and the 400s: with add_generation_prompt true, a last message of another role, a
   template that changes the content;
2. skip_special_tokens: true drops control tokens' text from the answer (a control token
   generated between words, streamed and not, both endpoints, text_offset, stop strings, the
   batch engine, a 400 where tool calls would be read from a control token); false and null
   keep it;
3. add_special_tokens: false leaves the vocab's BOS out of the prompt, true and null add it;
   spaces_between_special_tokens: both values read, the same answer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gguf
import httpx
import pytest
import torch
from server_helpers import run_direct

from minfer.catalog import model_path
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer, render_chat
from minfer.tokenizer.chat_template import chat_token_ids
from minfer.tokenizer.continuation import ContinuationError, open_final_message

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
ASK = {"role": "user", "content": "Name a color."}
SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
               "Face<|im_end|>\n")


def post(srv, body, path=CHAT, status=200):
    r = httpx.post(srv.url + path, json=body, timeout=600)
    assert r.status_code == status, r.text
    return r.json()


def answer(out, path=CHAT):
    choice = out["choices"][0]
    return choice["message"]["content"] if path == CHAT else choice["text"]


def stream(srv, body, path=CHAT):
    """(text, finish_reason) of a streamed answer."""
    text, finish = "", None
    with httpx.stream("POST", srv.url + path, json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += (choice.get("delta") or {}).get("content") or "" if path == CHAT else choice["text"]
            finish = choice["finish_reason"] or finish
    return text, finish


def llama3_vocab(tmp_path: Path) -> Tokenizer:
    """A SentencePiece vocab with Llama 3's turn markers: no template, so minfer's Llama 3 format
    (templates.LLAMA_3, llama.cpp's, which trims content); it adds BOS (<s>, id 1) by default."""
    specials = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pieces = ["▁", "▁a", "a", "b", "c", "▁b", "u", "s", "e", "r", "t", "n", "i", "o", "▁c", "\n"]
    tokens = ["<unk>", "<s>", "</s>", *specials, *pieces]
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [3] * len(specials) + [1] * len(pieces))
    w.add_token_scores([0.0] * len(tokens))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = Tokenizer.from_gguf(GGUFFile(tmp_path / "v.gguf"))
    assert tok.chat_format == "llama3" and tok.add_bos and tok.bos_id == 1
    return tok


# ---- 1. continue_final_message: the prompt ---------------------------------------------------

def test_chatml_leaves_the_final_message_open(engine):
    tok = engine.tokenizer   # SmolLM2's own ChatML template
    msgs = [ASK, {"role": "assistant", "content": "The color is "}]
    want = SMOL_SYSTEM + "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\nThe color is "
    ids = chat_token_ids(tok, msgs, continue_final_message=True)
    assert ids == tok.encode(want, parse_special=True) and tok.decode(ids) == want
    # add_generation_prompt is not consulted: a continued message has no generation prompt after it
    assert chat_token_ids(tok, msgs, add_generation_prompt=True, continue_final_message=True) == ids
    # closed, the same message ends its turn
    closed = chat_token_ids(tok, msgs, add_generation_prompt=False)
    assert tok.decode(closed) == want + "<|im_end|>\n" and closed[:len(ids) - 1] == ids[:-1]


def test_qwen_template_leaves_the_final_message_open_and_content_stays_text():
    tok = Tokenizer.from_gguf(GGUFFile(model_path("qwen2.5-coder-0.5b-instruct")))
    msgs = [ASK, {"role": "assistant", "content": "Sure <|im_start|>"}]
    want = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\nSure <|im_start|>")
    ids = chat_token_ids(tok, msgs, continue_final_message=True)
    assert tok.decode(ids) == want
    # the client's "<|im_start|>" stays text: not the control token, which only the template writes
    assert ids.count(tok.encode("<|im_start|>", add_bos=False)[0]) == 3
    head = want[:-len("Sure <|im_start|>")]
    assert ids == tok.encode(head) + tok.encode("Sure <|im_start|>", add_bos=False, parse_special=False)


def test_llama3_trimmed_content_is_cut_where_it_ends(tmp_path):
    tok = llama3_vocab(tmp_path)
    msgs = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": " b a "}]
    want = ("<|start_header_id|>user<|end_header_id|>\n\na b<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nb a")   # `| trim`: the spaces are gone
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == want + "<|eot_id|>"
    ids = chat_token_ids(tok, msgs, continue_final_message=True)
    eot = tok.encode("<|eot_id|>", add_bos=False)
    assert ids == tok.encode(want) and ids[0] == tok.bos_id and ids[-1:] != eot
    assert chat_token_ids(tok, msgs, continue_final_message=True, add_special=False) == tok.encode(want, add_bos=False)


def test_gpt_oss_template_leaves_the_final_channel_open():
    tmpl = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    msgs = [ASK, {"role": "assistant", "content": "The color is "}]
    render = lambda m: render_chat(tmpl, m, add_generation_prompt=False)  # noqa: E731
    full = render(msgs)
    assert full.endswith("<|start|>assistant<|channel|>final<|message|>The color is <|return|>")
    assert open_final_message(render, msgs) == full[:-len("<|return|>")]


def test_trailing_space_is_kept_where_the_template_keeps_it(engine):
    # transformers cuts " Hi " after "Hi" (its check compares against the content with its
    # leading space); the template kept the trailing space, so the open message keeps it
    tok = engine.tokenizer
    text = tok.decode(chat_token_ids(tok, [ASK, {"role": "assistant", "content": " Hi "}], continue_final_message=True))
    assert text.endswith("<|im_start|>assistant\n Hi ")


@pytest.mark.parametrize("content", ["", "  "])
def test_an_empty_final_message_opens_right_after_its_header(engine, content):
    # transformers found "" at the end of the text: the "open" message was closed
    tok = engine.tokenizer
    text = tok.decode(chat_token_ids(tok, [ASK, {"role": "assistant", "content": content}],
                                     continue_final_message=True))
    assert text.endswith("<|im_start|>assistant\n" + content)


def test_a_template_that_changes_the_content_is_an_error():
    upper = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    render = lambda m: render_chat(upper, m, add_generation_prompt=False)  # noqa: E731
    with pytest.raises(ContinuationError, match="does not appear in the chat"):
        open_final_message(render, [ASK, {"role": "assistant", "content": "The color is"}])
    dropped = "{% for m in messages %}{{ m.role }}{% endfor %}"
    with pytest.raises(ContinuationError, match="empty"):
        open_final_message(lambda m: render_chat(dropped, m), [ASK, {"role": "assistant", "content": ""}])
    with pytest.raises(ContinuationError, match="'user' message") as e:
        open_final_message(render, [ASK])
    assert isinstance(e.value, MinferError)


# ---- 1. continue_final_message: the server ---------------------------------------------------

def test_continue_final_message_over_http(server, engine, params_cls):
    msgs = [ASK, {"role": "assistant", "content": "The color is"}]
    ids = chat_token_ids(engine.tokenizer, msgs, continue_final_message=True)
    assert engine.tokenizer.decode(ids).endswith("<|im_start|>assistant\nThe color is")
    body = {"messages": msgs, "max_tokens": 6, "temperature": 0, "continue_final_message": True}
    ref, n, finish = run_direct(engine, params_cls, ids, 6, temperature=0.0)
    for extra in ({}, {"add_generation_prompt": False}, {"add_generation_prompt": None}):
        out = post(server, {**body, **extra})
        assert out["usage"]["prompt_tokens"] == len(ids)
        assert answer(out) == ref and out["usage"]["completion_tokens"] == n
    assert stream(server, body) == (ref, finish)
    # false and null: a new assistant turn after the closed message, as before
    closed = chat_token_ids(engine.tokenizer, msgs)
    for value in (False, None):
        assert post(server, {**body, "continue_final_message": value})["usage"]["prompt_tokens"] == len(closed)


@pytest.mark.parametrize("messages, extra, says", [
    ([ASK, {"role": "assistant", "content": "The"}], {"add_generation_prompt": True},
     "continue_final_message and add_generation_prompt are both true"),
    ([ASK], {}, "the last message (messages[0]) is a user message"),
    ([ASK, {"role": "assistant", "content": "x"}, {"role": "system", "content": "Be brief."}], {},
     "(messages[2]) is a system message"),
    ([ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}], {}, "has tool_calls"),
])
def test_continue_final_message_errors_name_the_fields(server, messages, extra, says):
    err = post(server, {"messages": messages, "max_tokens": 2, "continue_final_message": True, **extra},
               status=400)["error"]
    assert err["param"] == "continue_final_message" and says in err["message"], err


def test_a_template_that_changes_the_content_is_a_400(engine, make_server):
    tok = copy.copy(engine.tokenizer)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    class Shouting:
        tokenizer = tok

        def __getattr__(self, name):
            return getattr(engine, name)

    srv = make_server(lambda: Shouting())
    srv.wait_ready()
    body = {"messages": [ASK, {"role": "assistant", "content": "The color is"}], "max_tokens": 2,
            "continue_final_message": True}
    err = post(srv, body, status=400)["error"]
    assert err["param"] == "continue_final_message" and "does not appear in the chat" in err["message"]
    post(srv, {**body, "continue_final_message": False})
    srv.stop()


@pytest.mark.parametrize("field, value, status", [
    ("continue_final_message", True, 400), ("continue_final_message", False, 200),
    ("add_generation_prompt", True, 400), ("add_generation_prompt", False, 200),
])
def test_chat_only_fields_on_completions(server, field, value, status):
    out = post(server, {"prompt": "Hi", "max_tokens": 1, field: value}, COMPLETIONS, status)
    if status == 400:
        assert out["error"]["param"] == field and "chat field" in out["error"]["message"]


@pytest.mark.parametrize("field", ["continue_final_message", "skip_special_tokens", "add_special_tokens",
                                   "spaces_between_special_tokens"])
def test_the_switches_are_booleans(server, field):
    err = post(server, {"messages": [ASK], "max_tokens": 1, field: "true"}, status=400)["error"]
    assert err["param"] == field


# ---- 2. skip_special_tokens ---------------------------------------------------------------

class Scripted:
    """The real engine, its sampling forced to `script` (a logits processor that leaves only the
    next scripted token); every other keyword (skip_special) reaches the real generate."""

    def __init__(self, inner, script):
        self.inner, self.script = inner, script

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def force(self, new, logits):
        out = torch.full_like(logits, float("-inf"))
        out[self.script[min(len(new), len(self.script) - 1)]] = 0.0
        return out

    def generate(self, prompt_ids, params, max_new_tokens, stop=(), **kw):
        kw["logits_processors"] = [*kw.get("logits_processors", ()), self.force]
        return self.inner.generate(prompt_ids, params, max_new_tokens, stop, **kw)


@pytest.fixture(scope="module")
def scripted(engine, make_server):
    """'Hello', <|im_start|> (a control token), ' there', <|im_end|> (the end of the turn)."""
    tok = engine.tokenizer
    hello, there = tok.encode("Hello", add_bos=False), tok.encode(" there", add_bos=False)
    im_start, im_end = tok.encode("<|im_start|>", add_bos=False), tok.encode("<|im_end|>", add_bos=False)
    assert (len(hello), len(there), im_start, im_end) == (1, 1, [1], [2]) and 2 in tok.eog_ids
    srv = make_server(lambda: Scripted(engine, hello + im_start + there + im_end))
    srv.wait_ready()
    return srv


BODIES = {CHAT: {"messages": [ASK]}, COMPLETIONS: {"prompt": "Say hello"}}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("value, want", [(True, "Hello there"), (False, "Hello<|im_start|> there"),
                                         (None, "Hello<|im_start|> there")])
def test_skip_special_tokens_streamed_and_not(scripted, path, value, want):
    body = {**BODIES[path], "max_tokens": 8, "temperature": 0, "skip_special_tokens": value}
    out = post(scripted, body, path)
    assert answer(out, path) == want and out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 4    # the skipped token is generated all the same
    assert stream(scripted, body, path) == (want, "stop")


def test_skipped_tokens_take_no_room_in_text_offset(scripted):
    body = {**BODIES[COMPLETIONS], "max_tokens": 8, "temperature": 0, "logprobs": 0}
    kept = post(scripted, body, COMPLETIONS)["choices"][0]["logprobs"]
    skipped = post(scripted, {**body, "skip_special_tokens": True}, COMPLETIONS)["choices"][0]["logprobs"]
    assert kept["tokens"][:3] == skipped["tokens"][:3] == ["Hello", "<|im_start|>", " there"]
    assert kept["text_offset"][:3] == [0, 5, 17] and skipped["text_offset"][:3] == [0, 5, 5]


def test_stop_strings_see_the_text_without_the_skipped_tokens(scripted):
    body = {**BODIES[CHAT], "max_tokens": 8, "temperature": 0, "stop": ["<|im_start|>"]}
    assert answer(post(scripted, body)) == "Hello"
    assert answer(post(scripted, {**body, "skip_special_tokens": True})) == "Hello there"
    assert answer(post(scripted, {**body, "stop": ["o t"], "skip_special_tokens": True})) == "Hell"


def test_skip_special_tokens_true_with_tools_needs_the_tool_tags_as_text():
    # the answer is parsed for <tool_call> tags: where the vocab has them as control tokens,
    # true would drop them and the calls would silently become nothing (vLLM's Hermes parser
    # turns the switch off); Qwen's tags are user-defined tokens, text either way
    from minfer.server.schemas import ChatCompletionRequest
    from minfer.server.tools import ToolError, plan_chat
    from minfer.tokenizer import vocab as V

    qwen = Tokenizer.from_gguf(GGUFFile(model_path("qwen2.5-coder-0.5b-instruct")))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    req = ChatCompletionRequest(messages=[ASK], tools=tools, skip_special_tokens=True)
    assert plan_chat(qwen, req, lambda m, extra: [1]).parse_tools
    tag = qwen.encode("<tool_call>", add_bos=False)
    assert len(tag) == 1 and qwen.token_attr(tag[0]) & V.ATTR_USER_DEFINED
    control = copy.copy(qwen)
    control._attrs = list(qwen._attrs)
    control._attrs[tag[0]] = V.ATTR_CONTROL
    with pytest.raises(ToolError, match="<tool_call> is a control token") as e:
        plan_chat(control, req, lambda m, extra: [1])
    assert e.value.param == "skip_special_tokens"
    for value in (False, None):
        plan_chat(control, req.model_copy(update={"skip_special_tokens": value}), lambda m, extra: [1])


def test_skip_special_on_the_engine_and_the_batch_engine(engine, params_cls):
    from minfer.runtime.batch_engine import BatchEngine

    tok = engine.tokenizer
    script = tok.encode("Hello", add_bos=False) + [1] + tok.encode(" there", add_bos=False) + [2]
    force = Scripted(engine, script).force
    prompt = tok.encode("Say hello")
    greedy = params_cls(temperature=0)
    for skip, want in ((True, "Hello there"), (False, "Hello<|im_start|> there")):
        evs = engine.generate(prompt, greedy, 8, logits_processors=[force], skip_special=skip)
        assert "".join(e.text for e in evs) == want
        be = BatchEngine.from_engine(engine, max_seqs=2)
        seq = be.add(prompt, greedy, 8, logits_processors=[force], skip_special=skip)
        text = ""
        while be.has_work:
            text += "".join(ev.text for s, ev in be.step() if s is seq and ev is not None)
        assert text == want
    with pytest.raises(MinferError, match="skip_special"):
        engine.generate(prompt, greedy, 2, skip_special="yes")


def test_skip_special_tokens_with_the_batch_worker(engine, make_server):
    srv = make_server(lambda: engine, parallel=2)
    srv.wait_ready()
    forced = {"prompt": "Say hi", "max_tokens": 3, "temperature": 0, "logit_bias": {"1": 100}}
    out = post(srv, {**forced, "skip_special_tokens": True}, COMPLETIONS)
    assert answer(out, COMPLETIONS) == "" and out["usage"]["completion_tokens"] == 3
    assert answer(post(srv, {**forced, "skip_special_tokens": False}, COMPLETIONS), COMPLETIONS) == "<|im_start|>" * 3
    assert stream(srv, {**forced, "skip_special_tokens": True}, COMPLETIONS) == ("", "length")
    srv.stop()


# ---- 3. add_special_tokens, spaces_between_special_tokens ----------------------------------

class Recording:
    """The real engine behind another tokenizer (prompt ids are small, any vocab's ids are the
    model's ids too), noting each prompt's ids."""

    def __init__(self, inner, tok):
        self.inner, self.tokenizer, self.prompts = inner, tok, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt_ids, *args, **kw):
        self.prompts.append(list(prompt_ids))
        return self.inner.generate(prompt_ids, *args, **kw)


@pytest.fixture(scope="module")
def llama3_server(engine, make_server, tmp_path_factory):
    rec = Recording(engine, llama3_vocab(tmp_path_factory.mktemp("llama3")))
    srv = make_server(lambda: rec)
    srv.wait_ready()
    return srv, rec


@pytest.mark.parametrize("value, bos", [(None, True), (True, True), (False, False)])
def test_add_special_tokens_on_chat(llama3_server, value, bos):
    srv, rec = llama3_server
    msgs = [{"role": "user", "content": "a b"}]
    post(srv, {"messages": msgs, "max_tokens": 1, "add_special_tokens": value})
    text = rec.tokenizer.apply_chat_template(msgs)
    assert rec.prompts[-1] == rec.tokenizer.encode(text, add_bos=bos)
    assert (rec.prompts[-1][0] == rec.tokenizer.bos_id) == bos
    # with continue_final_message too
    msgs = [*msgs, {"role": "assistant", "content": "b a"}]
    post(srv, {"messages": msgs, "max_tokens": 1, "add_special_tokens": value, "continue_final_message": True})
    assert rec.prompts[-1] == chat_token_ids(rec.tokenizer, msgs, continue_final_message=True,
                                             add_special=None if bos else False)


@pytest.mark.parametrize("value, bos", [(None, True), (True, True), (False, False)])
def test_add_special_tokens_on_completions(llama3_server, value, bos):
    srv, rec = llama3_server
    post(srv, {"prompt": "a b", "max_tokens": 1, "add_special_tokens": value}, COMPLETIONS)
    assert rec.prompts[-1] == rec.tokenizer.encode("a b", add_bos=bos)
    assert (rec.prompts[-1][0] == 1) == bos


def test_a_prompt_of_token_ids_is_used_as_sent(llama3_server):
    srv, rec = llama3_server
    for value in (None, False):
        post(srv, {"prompt": [8, 9], "max_tokens": 1, "add_special_tokens": value}, COMPLETIONS)
        assert rec.prompts[-1] == [8, 9]
    err = post(srv, {"prompt": [8, 9], "max_tokens": 1, "add_special_tokens": True}, COMPLETIONS, 400)["error"]
    assert err["param"] == "add_special_tokens" and "used as sent" in err["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_spaces_between_special_tokens_is_read_and_answers_alike(scripted, path):
    # minfer never puts spaces around special tokens' text (false); vLLM's true does the same
    # for fast tokenizers, which GGUF vocabs are
    body = {**BODIES[path], "max_tokens": 8, "temperature": 0, "skip_special_tokens": False}
    for value in (True, False, None):
        assert answer(post(scripted, {**body, "spaces_between_special_tokens": value}, path), path) == \
            "Hello<|im_start|> there"


def test_engine_chat_continues_the_final_message(engine):
    """Engine.chat(continue_final_message=True): the Python API's form of the field. The prompt it
    generates from is chat_token_ids' open form (ending in the assistant's own words, no <|im_end|>),
    and its reply is that prompt's greedy continuation; a non-assistant last message is refused."""
    from minfer.errors import MinferError
    from minfer.tokenizer.chat_template import chat_token_ids

    tok = engine.tokenizer
    msgs = [{"role": "user", "content": "Name three colours."}, {"role": "assistant", "content": "Red, green"}]
    want_ids = chat_token_ids(tok, msgs, continue_final_message=True)
    assert tok.decode(want_ids).endswith("Red, green")
    seen = []
    inner = engine.generate

    def spy(ids, *a, **k):
        seen.append(list(ids))
        return inner(ids, *a, **k)

    engine.generate = spy
    try:
        got = engine.chat(msgs, max_tokens=4, temperature=0, continue_final_message=True)
        closed = engine.chat(msgs, max_tokens=4, temperature=0)
    finally:
        del engine.generate
    assert seen[0] == want_ids and seen[1] == chat_token_ids(tok, msgs) and seen[0] != seen[1]
    want = "".join(ev.text for ev in engine.generate(want_ids, max_new_tokens=4, temperature=0))
    assert got == want and isinstance(closed, str)
    with pytest.raises(MinferError, match="assistant message"):
        engine.chat(msgs[:1], max_tokens=2, continue_final_message=True)
    with pytest.raises(MinferError, match="continue_final_message"):
        engine.chat(msgs, max_tokens=2, continue_final_message="yes")
