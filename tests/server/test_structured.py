"""Structured output: response_format json_object / json_schema through the real `openai` and
`langchain-openai` clients, on the real SmolLM2 model. Every answer is checked by `jsonschema`
(an independent validator), greedy and sampled; the grammar's mask itself is checked against
documents tokenized by minfer's tokenizer; logit_bias moves the greedy choice."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch

from server_helpers import chat_ids, run_direct

MODEL = "smollm2-135m-instruct"
CITY = {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
                       "tags": {"type": "array", "items": {"type": "string", "enum": ["big", "old", "coastal"]},
                                "maxItems": 3}},
        "required": ["city", "population", "tags"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Name the largest city of France, its population and some tags, as JSON."}]


def _schema_format(schema, name="city"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_json_schema_greedy_is_valid_and_matches_the_engine(client, engine, params_cls):
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80,
                                       response_format=_schema_format(CITY))
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), CITY)
    assert r.choices[0].finish_reason == "stop"
    # the unconstrained greedy answer of the same prompt is not this JSON: the mask did the work
    free, _, _ = run_direct(engine, params_cls, chat_ids(engine, ASK), 20, temperature=0.0)
    assert not free.startswith(text[:20])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_sampled_is_valid_every_time(client, seed):
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0, top_p=1.0, seed=seed,
                                       extra_body={"top_k": 0, "min_p": 0.0}, max_tokens=80,
                                       response_format=_schema_format(CITY))
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)


def test_json_object_gives_an_object(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a cat in JSON."}],
                                       temperature=0, max_tokens=60, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")


def test_streamed_json_schema_is_the_same_document(client):
    kw = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=80, response_format=_schema_format(CITY))
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    assert "".join(parts) == whole


def test_openai_parse_with_a_pydantic_model(client):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        # bounds: a 135M model may otherwise write a long name or repeat a digit until max_tokens
        city: str = Field(max_length=24)
        population: int = Field(ge=0, le=100_000_000)

    r = client.chat.completions.parse(model=MODEL, messages=ASK, temperature=0, max_tokens=60, response_format=City)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City) and isinstance(parsed.population, int)


def test_langchain_with_structured_output(server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and its population."""
        city: str = Field(max_length=24)
        population: int = Field(ge=0, le=100_000_000)

    llm = ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="unused", temperature=0,
                     max_tokens=60, max_retries=0)
    out = llm.with_structured_output(City, method="json_schema").invoke(ASK[0]["content"])
    assert isinstance(out, City)
    # method="json_mode": json_object, parsed by LangChain
    out = llm.with_structured_output(method="json_mode").invoke("Return a JSON object describing Paris.")
    assert isinstance(out, dict)


@pytest.mark.parametrize("fmt, param", [
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format"),
    (_schema_format({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
     "response_format.json_schema.schema"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_bad_response_formats_are_400s(server, fmt, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": ASK, "max_tokens": 4, "response_format": fmt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err


def test_grammar_mask_follows_the_schema(engine):
    """The mask against documents tokenized by minfer: every token of a valid document is
    allowed and EOS only after its last; a document missing a required key is refused."""
    from minfer.server.structured import GrammarConstraint, json_schema_grammar

    tok = engine.tokenizer
    eog = sorted(tok.eog_ids)
    good = tok.encode(json.dumps({"city": "Paris", "population": 2100000, "tags": ["big", "old"]}), add_bos=False)
    c = GrammarConstraint(tok, json_schema_grammar(CITY))
    zeros = torch.zeros(tok.n_vocab)
    for k, t in enumerate(good):
        allowed = torch.isfinite(c(good[:k], zeros))
        assert allowed[t], (k, tok.decode(good[:k + 1]))
        assert not allowed[eog].any(), k
    allowed = torch.isfinite(c(good, zeros))
    assert allowed[eog].all() and allowed.sum() == len(eog)

    bad = tok.encode(json.dumps({"city": "Paris", "tags": []}), add_bos=False)  # no population
    c = GrammarConstraint(tok, json_schema_grammar(CITY))
    refused = next(k for k, t in enumerate(bad) if not torch.isfinite(c(bad[:k], zeros))[t])
    # the first refused token is where "tags" starts instead of "population"
    assert tok.decode(bad[:refused]) == '{"city": "Paris", "' and "tags" in tok.decode([bad[refused]])


def test_grammar_token_bytes_are_the_tokenizers_bytes(engine):
    """The adapter's byte strings rebuild what the tokenizer decodes (special tokens marked 0xFF)."""
    from minfer.server.structured import grammar_token_bytes

    tok = engine.tokenizer
    tb = grammar_token_bytes(tok)
    text = 'Réponse: {"a": [1, 2.5, "日本"]} <|im_end|>'
    ids = tok.encode(text, add_bos=False)
    special = [i for i in ids if tb[i].startswith(b"\xff")]
    assert special == [tok.encode("<|im_end|>", add_bos=False)[0]]
    assert b"".join(tb[i].removeprefix(b"\xff") for i in ids).decode() == tok.decode(ids)


def test_logit_bias_bans_and_forces(client, engine):
    msgs = [{"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=1, logprobs=True)
    tok0 = first.choices[0].logprobs.content[0]
    tid = engine.tokenizer.encode(tok0.token, add_bos=False)[0]
    banned = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=1, logprobs=True,
                                            logit_bias={str(tid): -100})
    assert banned.choices[0].logprobs.content[0].token != tok0.token
    forced_id = engine.tokenizer.encode(" banana", add_bos=False)[0]
    forced = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=1,
                                            logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content == engine.tokenizer.decode([forced_id])


def test_cli_run_json_schema(tmp_path):
    """`minfer run --json-schema FILE` as a user runs it: stdout is JSON valid for the schema."""
    import subprocess
    import sys

    path = tmp_path / "city.json"
    path.write_text(json.dumps(CITY))
    proc = subprocess.run([sys.executable, "-m", "minfer", "run", "-m", MODEL, "--device", "cpu", "--temp", "0",
                           "-n", "80", "--json-schema", str(path), ASK[0]["content"]],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    jsonschema.validate(json.loads(proc.stdout), CITY)
    assert "finish: stop" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "minfer", "run", "-m", MODEL, "--json-schema", '{"type": 3', "x"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--json-schema" in bad.stderr and "Traceback" not in bad.stderr


def test_json_schema_under_continuous_batching(engine, make_server):
    """Each row of a batch keeps its own grammar (BatchWorker: --parallel 2, three requests at once)."""
    import threading

    import openai

    srv = make_server(lambda: engine, parallel=2)
    srv.wait_ready()
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    schemas = [CITY, {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                      "additionalProperties": False}, {"type": "array", "items": {"type": "integer", "maximum": 99},
                                                       "minItems": 2, "maxItems": 3}]
    out: dict[int, tuple[str, str]] = {}

    def ask(i: int) -> None:
        r = c.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80,
                                      response_format=_schema_format(schemas[i], f"s{i}"))
        out[i] = (r.choices[0].message.content, r.choices[0].finish_reason)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert sorted(out) == [0, 1, 2]
    for i, (text, finish) in out.items():
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), schemas[i])
