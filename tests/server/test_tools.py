"""Tool calls: OpenAI `tools` / `tool_choice` through Qwen2.5's own chat template, the model's
<tool_call> output parsed into `tool_calls` (whole and streamed), and a round trip in which the
client answers with a tool message. Driven by the real `openai` and `langchain-openai` clients
against qwen2.5-coder-0.5b-instruct, the smallest catalog model whose template renders tools;
a forced tool_choice makes even this small model's call valid JSON for the parameters schema.

The parsing and streaming parts are also checked without a model, on fixed texts."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minfer.server.tools import ToolError, ToolStreamParser, parse_tool_calls, template_messages

QWEN = "qwen2.5-coder-0.5b-instruct"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
RESULT = '{"temperature": 23, "sky": "sunny"}'
WEATHER_ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "strict": False, "schema": {
    "type": "object",
    "properties": {"temperature": {"type": "integer"}, "summary": {"type": "string", "maxLength": 60}},
    "required": ["temperature", "summary"], "additionalProperties": False}}}


# ---- without a model ----------------------------------------------------------------------

TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>')


def test_parse_tool_calls_hermes_blocks():
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # not a call: stays content, nothing lost
    assert parse_tool_calls("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    assert parse_tool_calls("plain answer") == ("plain answer", [])


@pytest.mark.parametrize("step", [1, 2, 3, 7, 11, len(TEXT)])
def test_stream_parser_gives_the_same_calls_at_any_chunking(step):
    p = ToolStreamParser()
    content, calls = "", []
    for i in range(0, len(TEXT), step):
        text, new = p.push(TEXT[i:i + step])
        content += text
        calls += new
        assert "<tool_call" not in text and "{\"name\"" not in text
    content += p.flush()
    ref_content, ref_calls = parse_tool_calls(TEXT)
    assert content.strip() == ref_content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in ref_calls]


def test_earlier_calls_reach_the_template_with_arguments_as_objects():
    from minfer.server.schemas import ChatCompletionRequest

    msgs = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    out = template_messages(ChatCompletionRequest(messages=msgs).messages)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert out[2] == {"role": "tool", "content": RESULT, "tool_call_id": "call_1"}
    msgs[1]["tool_calls"][0]["function"]["arguments"] = "{city: Paris"
    with pytest.raises(ToolError) as e:
        template_messages(ChatCompletionRequest(messages=msgs).messages)
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"


# ---- through the server, on Qwen2.5 -------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_engine():
    from minfer.catalog import resolve_model
    from minfer.runtime.engine import Engine

    return Engine.load(str(resolve_model(QWEN)), device="cpu", ctx=1024)


@pytest.fixture(scope="module")
def qwen_server(qwen_engine, make_server):
    srv = make_server(lambda: qwen_engine, served_name=QWEN)
    srv.wait_ready()
    return srv


@pytest.fixture()
def qclient(qwen_server):
    import openai

    return openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _forced_call(qclient, **kw):
    return qclient.chat.completions.create(model=QWEN, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                           temperature=0, max_tokens=40, **kw)


@pytest.fixture(scope="module")
def forced(qwen_server):
    import openai

    return _forced_call(openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0,
                                      timeout=600))


def test_forced_tool_call_is_valid_for_the_schema(forced):
    r = forced
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS)
    assert "paris" in args["city"].lower()


def test_streamed_tool_call_is_the_same_call(qclient, forced):
    whole = forced.choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in _forced_call(qclient, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content  # the call never leaks as text
        for tc in delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
            c["id"] = tc.id or c["id"]
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert (calls[0]["name"], calls[0]["arguments"]) == (whole.function.name, whole.function.arguments)
    assert calls[0]["id"].startswith("call_")


def test_round_trip_through_langchain(qwen_server, qwen_engine):
    """LangChain binds the tools and forces a call; the client runs the tool and answers with a
    ToolMessage; the second turn's prompt holds the call and its result in the template's
    <tool_response> form (counted in prompt tokens), and the model's answer uses the result.
    (The answer is asked for as JSON -- not "strict", which LangChain allows only with strict
    tools; minfer enforces the schema either way. Unconstrained, this 0.5B model repeats the call instead
    of answering; constrained, it reads 23 and "sunny" from the tool result.)"""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=QWEN, base_url=qwen_server.url + "/v1", api_key="unused", temperature=0,
                     max_tokens=40, max_retries=0)
    history = [HumanMessage(ASK[0]["content"])]
    ai = llm.bind_tools(TOOLS, tool_choice="get_weather").invoke(history)
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], PARAMS)
    history += [ai, ToolMessage(RESULT, tool_call_id=call["id"])]
    # with a response_format, LangChain parses through openai's .parse(), which wants strict tools
    strict_tools = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    answer = llm.bind_tools(strict_tools).bind(response_format=WEATHER_ANSWER).invoke(history)

    # the prompt the server must have built: the template on plain dicts, built here
    tok = qwen_engine.tokenizer
    msgs = [ASK[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": call["args"]}}]},
        {"role": "tool", "content": RESULT}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tools=strict_tools)
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in prompt
    assert json.dumps({"name": "get_weather", "arguments": call["args"]}) in prompt
    assert answer.usage_metadata["input_tokens"] == len(tok.encode(prompt))
    assert not answer.tool_calls
    out = json.loads(answer.content)
    assert out["temperature"] == 23 and "sunny" in out["summary"].lower()


def test_tools_on_a_template_without_tools_are_a_400(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2-135m-instruct", messages=ASK, tools=TOOLS, max_tokens=4)
    assert e.value.body["code"] == "unsupported_value" and e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2-135m-instruct", messages=ASK, tool_choice="required",
                                       max_tokens=4)
    assert e.value.body["param"] == "tool_choice"


def test_a_named_tool_that_is_not_offered_is_a_400(qclient):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        qclient.chat.completions.create(model=QWEN, messages=ASK, tools=TOOLS, max_tokens=4,
                                        tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice" and "nope" in e.value.body["message"]


def test_a_tool_whose_schema_cannot_be_compiled_is_a_short_400_naming_the_tool(qclient):
    """llguidance's error for a bad tool schema carried the whole generated grammar (tens of
    lines); the 400 says what failed in one line, and which tools were offered."""
    import openai

    bad = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "pattern": "(unclosed"}}, "required": ["q"]}}}]
    with pytest.raises(openai.BadRequestError) as e:
        qclient.chat.completions.create(model=QWEN, messages=ASK, tools=bad, tool_choice="required", max_tokens=4)
    body = e.value.body
    assert body["param"] == "tools", body
    assert "\n" not in body["message"] and len(body["message"]) < 600, body["message"]
    assert "'lookup'" in body["message"] and "unclosed group" in body["message"], body["message"]


def test_constrained_parallel_calls_are_bounded(engine):
    """Under tool_choice "required" with parallel calls the grammar takes at most
    MAX_PARALLEL_CALLS calls: after the last one only the end is allowed (a small model used to
    answer call after call until max_tokens)."""
    import torch

    from minfer.server.schemas import Tool
    from minfer.server.structured import GrammarConstraint, lark_grammar
    from minfer.server.tools import MAX_PARALLEL_CALLS, tool_call_lark

    tok = engine.tokenizer
    tool = Tool(type="function", function={"name": "f", "parameters": {"type": "object", "properties": {}}})
    one = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    c = GrammarConstraint(tok, lark_grammar(tool_call_lark(tok, [tool], parallel=True)))
    zeros = torch.zeros(tok.n_vocab)
    nl = tok.encode("\n", add_bos=False)
    eog = sorted(tok.eog_ids)
    for n in (1, MAX_PARALLEL_CALLS - 1, MAX_PARALLEL_CALLS):
        ids = tok.encode("\n".join([one] * n), add_bos=False)
        c = GrammarConstraint(tok, lark_grammar(tool_call_lark(tok, [tool], parallel=True)))
        allowed = torch.isfinite(c(ids, zeros))
        assert allowed[eog].all(), n
        assert bool(allowed[nl[0]]) == (n < MAX_PARALLEL_CALLS), n
