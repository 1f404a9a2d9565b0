"""The server driven by the official `openai` client: chat, completions, streaming, stop strings,
seeds, max_tokens, usage, logprobs. The reference for every answer is the engine itself, run
in-process on the same prompt ids (greedy), so a lost, doubled or garbled token shows."""

from __future__ import annotations

import math

from server_helpers import chat_ids, run_direct

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9,"  # a prompt the model continues without stopping


def test_models_lists_the_served_model_and_the_queueing(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]
    meta = models.data[0].model_extra["meta"]
    assert meta["max_concurrent_requests"] == 1
    assert "first-in first-out" in meta["scheduling"]
    assert meta["loaded"] is True and meta["n_ctx"] == 512


def test_chat_greedy_matches_the_engine_and_counts_usage(client, engine, params_cls):
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=MESSAGES,
                                       temperature=0, max_tokens=12)
    ids = chat_ids(engine, MESSAGES)
    text, n, finish = run_direct(engine, params_cls, ids, 12, temperature=0.0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "smollm2-135m-instruct" and isinstance(r.created, int)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == text and text.strip()
    assert choice.finish_reason == finish
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == n
    assert r.usage.total_tokens == len(ids) + n


def test_completion_greedy_matches_the_engine(client, engine, params_cls):
    prompt = "The capital of France is"
    r = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, temperature=0, max_tokens=10)
    ids = list(engine.tokenizer.encode(prompt))
    text, n, finish = run_direct(engine, params_cls, ids, 10, temperature=0.0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == text and text.strip()
    assert r.choices[0].finish_reason == finish
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), n, len(ids) + n)


def test_prompt_as_a_list_of_one_string_and_as_token_ids(client, engine):
    kw = dict(model="smollm2-135m-instruct", temperature=0, max_tokens=6)
    a = client.completions.create(prompt="Hello, my name is", **kw)
    b = client.completions.create(prompt=["Hello, my name is"], **kw)
    ids = list(engine.tokenizer.encode("Hello, my name is"))
    c = client.completions.create(prompt=ids, **kw)
    assert a.choices[0].text == b.choices[0].text == c.choices[0].text
    assert a.usage.prompt_tokens == c.usage.prompt_tokens == len(ids)


def test_max_tokens_ends_with_length(client):
    r = client.completions.create(model="smollm2-135m-instruct", prompt=COUNTING, temperature=0, max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    c = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_completion_tokens=2,
                                       messages=[{"role": "user", "content": "Write a long poem about the sea."}])
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 2


def test_chat_stream_equals_the_non_streamed_answer(client):
    kw = dict(model="smollm2-135m-instruct", messages=MESSAGES, temperature=0, max_tokens=12)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in with_choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    # include_usage: one last chunk with no choices and the usage, null usage on the others
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_equals_the_non_streamed_answer(client):
    kw = dict(model="smollm2-135m-instruct", prompt="Once upon a time", temperature=0, max_tokens=10)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage, no usage


def test_stream_ends_with_done(server):
    import httpx

    body = {"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1


def test_stop_strings_cut_the_text(client):
    kw = dict(model="smollm2-135m-instruct", prompt=COUNTING, temperature=0, max_tokens=16)
    free = client.completions.create(**kw).choices[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = words[2]  # a word that does occur, not at the start
    expected = free[: free.index(stop)]
    r = client.completions.create(stop=stop, **kw)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    # a list: the earliest match wins, a stop that never occurs changes nothing
    r2 = client.completions.create(stop=["never-in-this-text", stop], **kw)
    assert r2.choices[0].text == expected and r2.choices[0].finish_reason == "stop"
    # streamed: the same cut, nothing of the stop string leaks in a chunk
    s = list(client.completions.create(stop=[stop], stream=True, **kw))
    assert "".join(c.choices[0].text for c in s) == expected


def test_same_seed_same_text(client):
    kw = dict(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Tell me a story."}],
              temperature=1.0, max_tokens=12)
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) >= 2  # sampling does use the seed


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=MESSAGES, temperature=0,
                                       max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # greedy: the chosen token is the most likely one
        assert e.token == e.top_logprobs[0].token and math.isclose(e.logprob, lps[0], abs_tol=1e-4)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    no = client.chat.completions.create(model="smollm2-135m-instruct", messages=MESSAGES, temperature=0, max_tokens=2)
    assert no.choices[0].logprobs is None


def test_completion_logprobs(client):
    r = client.completions.create(model="smollm2-135m-instruct", prompt=COUNTING, temperature=0,
                                  max_tokens=5, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_completion_echo(client):
    kw = dict(model="smollm2-135m-instruct", prompt="The sky is", temperature=0, max_tokens=4)
    plain = client.completions.create(**kw).choices[0].text
    echoed = client.completions.create(echo=True, **kw).choices[0].text
    assert echoed == "The sky is" + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(echo=True, stream=True, **kw))
    assert streamed == echoed


def test_sampling_fields_reach_the_engine(client, engine, params_cls):
    kw = dict(model="smollm2-135m-instruct", prompt=COUNTING, max_tokens=12)
    greedy = client.completions.create(temperature=0, **kw).choices[0].text
    # cuts that leave only the most likely token make hot sampling greedy, whatever the seed
    # (top_k and min_p are not in the openai client's signature: they go as extra_body)
    for cut in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6}):
        for seed in (1, 2):
            r = client.completions.create(temperature=1.5, seed=seed, extra_body=cut, **kw)
            assert r.choices[0].text == greedy, cut
    # penalties change a repetitive greedy continuation, exactly as the engine run directly does
    ids = list(engine.tokenizer.encode(COUNTING))
    for field, param, value in (("frequency_penalty", "frequency_penalty", 2.0),
                                ("presence_penalty", "presence_penalty", 2.0),
                                ("repetition_penalty", "repeat_penalty", 3.0)):
        r = client.completions.create(temperature=0, extra_body={field: value}, **kw)
        ref, _, _ = run_direct(engine, params_cls, ids, 12, temperature=0.0, **{param: value})
        assert r.choices[0].text == ref != greedy, field
