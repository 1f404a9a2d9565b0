"""The first hour of a Python user: minfer.load() and the Engine's public calls.

Each test names what a user hit before its fix. The synthetic tiny model (byte-level vocab, a
ChatML template) keeps them fast; what they check is the argument handling, not the text.
"""

from __future__ import annotations

import threading

import pytest
import torch

from helpers_cli import write_tiny_model

import minfer
from minfer import MinferError


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def eng(path):
    return minfer.load(path, device="cpu", ctx=128, progress=False)


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, MinferError) and "\n" not in msg, msg
    return msg


GREEDY = dict(temperature=0)


SEEDED = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)   # varied bytes from the tiny model


def test_stop_given_as_one_string_is_one_stop_string(eng):
    # stop="xyz" was iterated as the stop strings 'x', 'y', 'z': the text ended at the first of
    # those characters. One string is one stop string (as OpenAI's `stop` takes it).
    text = eng.complete("Hello", max_tokens=40, **SEEDED)
    assert len(set(text)) > 8, text
    absent = text[1] + "\u2603"         # its first character is in the text, the whole is not
    assert absent not in text
    assert eng.complete("Hello", max_tokens=40, stop=absent, **SEEDED) == text
    word = text[-5:-2]
    got = eng.complete("Hello", max_tokens=40, stop=word, **SEEDED)
    assert got == text[:text.index(word)], (got, text, word)
    assert eng.complete("Hello", max_tokens=40, stop=[word], **SEEDED) == got
    assert eng.complete("Hello", max_tokens=40, stop=None, **SEEDED) == text
    assert eng.stats["finish_reason"] == "length" and eng.stats["gen_tokens"] == 40   # complete() shows
    eng.complete("Hello", max_tokens=40, stop=word, **SEEDED)                          # only the text
    assert eng.stats["finish_reason"] == "stop"
    eng.complete("Hello", max_tokens=0)
    assert eng.stats["finish_reason"] == "length" and eng.stats["gen_tokens"] == 0


@pytest.mark.parametrize("stop, expected", [(5, "stop: expected a string or a list of strings, got int 5"),
                                            ([5], "stop[0]: expected a string, got int 5"),
                                            (["a", None], "stop[1]: expected a string")])
def test_a_stop_of_the_wrong_type_is_named(eng, stop, expected):
    # was TypeError "'int' object is not iterable" / "must be str, not int"
    with pytest.raises(MinferError) as e:
        eng.complete("Hello", max_tokens=4, stop=stop, **GREEDY)
    assert expected in one_line(e)


@pytest.mark.parametrize("value", ["16", 2.5, -1, True])
def test_max_tokens_must_be_a_count(eng, value):
    # "16" and 2.5 were run as 16 and 2 tokens, -1 answered '' without a word
    with pytest.raises(MinferError) as e:
        eng.complete("Hello", max_tokens=value, **GREEDY)
    assert one_line(e).startswith("max_tokens: expected an integer >= 0 or None"), str(e.value)
    with pytest.raises(MinferError) as e:
        eng.generate(eng.tokenizer.encode("Hello"), None, value)     # raised at the call, not at next()
    assert one_line(e).startswith("max_new_tokens: expected an integer >= 0")


def test_an_unknown_sampling_keyword_lists_the_known_ones(eng):
    # was TypeError "SamplingParams.__init__() got an unexpected keyword argument 'temprature'"
    with pytest.raises(MinferError) as e:
        eng.complete("Hello", max_tokens=4, temprature=0)
    msg = one_line(e)
    assert "'temprature'" in msg and "temperature" in msg and "seed" in msg, msg
    with pytest.raises(MinferError) as e:
        eng.complete("Hello", max_tokens=4, temperature=-1)
    assert "temperature" in one_line(e)


@pytest.mark.parametrize("prompt", [[1, 2, 3], [{"role": "user", "content": "hi"}], 123, None])
def test_complete_refuses_a_prompt_that_is_not_text(eng, prompt):
    # a list ended in StopIteration, 123 in "argument of type 'int' is not iterable"
    with pytest.raises(MinferError) as e:
        eng.complete(prompt, max_tokens=4, **GREEDY)
    msg = one_line(e)
    assert msg.startswith("prompt: expected a str") and "chat(messages)" in msg, msg


def test_generate_checks_its_arguments_at_the_call(eng):
    with pytest.raises(MinferError) as e:
        eng.generate("Hello")                           # was ValueError: invalid literal for int(): 'H'
    assert "prompt_ids: expected a list of token ids" in one_line(e)
    with pytest.raises(MinferError) as e:
        eng.logits("Hello")                             # was ValueError too
    assert one_line(e).startswith("tokens: expected a list of token ids")
    with pytest.raises(MinferError) as e:
        eng.generate([1, "a"])
    assert one_line(e).startswith("prompt_ids[1]: expected a token id (int), got str")
    with pytest.raises(MinferError) as e:
        eng.generate([1, 2], {"temperature": 0})        # was AttributeError: 'dict' ... 'seed'
    assert one_line(e).startswith("params: expected a minfer.runtime.sampling.SamplingParams")
    with pytest.raises(MinferError) as e:
        eng.generate([1, 2], None, 2, top_logprobs=-1)  # was silently no top_logprobs
    assert one_line(e).startswith("top_logprobs: expected an integer >= 0")
    with pytest.raises(MinferError) as e:
        eng.generate([1, 2], None, 2, logits_processors=[None])
    assert one_line(e).startswith("logits_processors[0]: expected a callable")
    evs = list(eng.generate(eng.tokenizer.encode("Hello"), minfer.SamplingParams(temperature=0), 3,
                            top_logprobs=2))
    assert len(evs) == 3 and all(len(ev.top_logprobs) == 2 for ev in evs)
    assert evs[-1].finish_reason == "length"
    # sampling keywords as complete() takes them (was TypeError: unexpected keyword 'temperature')
    assert [ev.token_id for ev in eng.generate(eng.tokenizer.encode("Hello"), max_new_tokens=3,
                                               temperature=0)] == [ev.token_id for ev in evs]
    with pytest.raises(MinferError) as e:
        eng.generate([1, 2], minfer.SamplingParams(), 2, temperature=0)
    assert "were both given" in one_line(e)
    with pytest.raises(MinferError) as e:
        eng.generate([1, 2], max_new_tokens=2, temprature=0)
    assert one_line(e).startswith("unknown keyword argument 'temprature'")


def test_chat_answers_messages_through_the_template(eng):
    # there was no chat(): a user had to find minfer.tokenizer.chat_template by themselves
    from minfer.tokenizer.chat_template import chat_token_ids

    msgs = [{"role": "user", "content": "Say hi"}]
    ids = chat_token_ids(eng.tokenizer, msgs)
    want = "".join(ev.text for ev in eng.generate(ids, minfer.SamplingParams(temperature=0), 12))
    assert eng.chat(msgs, max_tokens=12, **GREEDY) == want
    assert "<|im_start|>" in eng.tokenizer.apply_chat_template(msgs)   # the template took part


@pytest.mark.parametrize("messages, expected", [
    ("hi", "messages: expected a non-empty list"),
    ([], "messages: expected a non-empty list"),
    (["hi"], "messages[0]: expected a dict"),
    ([{"role": "user"}], "messages[0]: expected a dict"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1]: expected a dict"),
])
def test_chat_names_the_bad_message(eng, messages, expected):
    with pytest.raises(MinferError) as e:
        eng.chat(messages, max_tokens=4)
    assert one_line(e).startswith(expected), str(e.value)


def test_close_and_the_with_block_free_the_engine(path):
    # there was no close() and no context manager: the weights lived until the last reference went
    with minfer.load(path, device="cpu", ctx=64, progress=False) as e2:
        assert e2.complete("Hi", max_tokens=2, **GREEDY) is not None
    assert e2.model is None and e2.cache is None
    for call in (lambda: e2.complete("Hi", max_tokens=2), lambda: e2.generate([1, 2]),
                 lambda: e2.chat([{"role": "user", "content": "a"}]), lambda: e2.logits([1, 2])):
        with pytest.raises(MinferError) as e:
            call()
        assert "this Engine was closed" in one_line(e)
    e2.close()   # twice is allowed


def test_an_iterator_resumed_after_a_later_call_fails_instead_of_mixing_caches(eng):
    # two generate() iterators interleaved used to step each other's cache: wrong text, no error
    a = eng.generate(eng.tokenizer.encode("Hello"), minfer.SamplingParams(temperature=0), 8)
    next(a)
    assert eng.complete("Other text", max_tokens=3, **GREEDY) is not None
    with pytest.raises(MinferError) as e:
        next(a)
    assert "resumed after a later call on the same Engine" in one_line(e)


def test_a_second_thread_is_refused_while_a_call_runs(eng, monkeypatch):
    # two threads on one Engine interleaved their tokens in one KV cache: wrong text, no error
    inside, release = threading.Event(), threading.Event()
    real = eng.model.forward

    def held(*args, **kw):             # the first thread's forward pass, held until released
        inside.set()
        release.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(eng.model, "forward", held)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("text", eng.complete("Hello", max_tokens=2, **GREEDY)))
    t.start()
    try:
        assert inside.wait(10)
        with pytest.raises(MinferError) as e:
            eng.complete("Other", max_tokens=2, **GREEDY)
        msg = one_line(e)
    finally:
        release.set()
        t.join(10)
    assert "already running a call in another thread" in msg, msg
    assert "text" in out                # the first call finished unharmed
    monkeypatch.undo()
    assert eng.complete("Hello", max_tokens=2, **GREEDY) == out["text"]


def test_load_names_the_bad_argument(path):
    cases = [(dict(model=None), "model: expected a catalog name"),
             (dict(model=path, ctx="512"), "ctx: expected a positive number of tokens (int) or None, got str"),
             (dict(model=path, ctx=0), "ctx: expected a positive number"),
             (dict(model=path, ctx=10**12), "ctx=1000000000000: the KV cache would need"),
             (dict(model=path, device="gpu"), "device='gpu': expected cuda or cpu"),
             (dict(model=path, device=0), "device: expected 'cpu', 'cuda' or None"),
             (dict(model=path, dtype="float16"), "dtype: expected a floating torch.dtype"),
             (dict(model=path, dtype=torch.int8), "dtype: expected a floating torch.dtype"),
             (dict(model=path, switches={"gemv": False}), "switches: expected a minfer.switches.Switches")]
    for kw, expected in cases:
        with pytest.raises(MinferError) as e:
            minfer.load(progress=False, **kw)
        assert expected in one_line(e), (kw, str(e.value))


def test_help_says_how_to_use_it():
    import pydoc

    top = pydoc.render_doc(minfer, renderer=pydoc.plaintext)
    for word in ("minfer.load", "complete(", "chat(", "generate(", "close()", "temperature", "seed",
                 "top_logprobs", "MinferError"):
        assert word in top, word
    assert {"Engine", "SamplingParams", "load", "MinferError"} <= set(dir(minfer))
    for name in ("complete", "chat", "generate", "close"):
        assert getattr(minfer.Engine, name).__doc__, name
    assert "ctx" in minfer.load.__doc__ and "close" in minfer.load.__doc__
