"""Request bodies of the OpenAI-compatible endpoints, as pydantic v2 models.

Only the requests are modelled: pydantic turns a wrong type, a missing field or an out-of-range
value into a RequestValidationError, which app.py answers with an OpenAI-style 400 error object.
Responses are plain dicts built in app.py (they are ours, so validating them buys nothing).

Field names and ranges follow OpenAI's API reference (platform.openai.com/docs/api-reference:
chat/create, completions/create); the non-OpenAI sampling fields (top_k, min_p,
repetition_penalty) use the names llama.cpp's server and vLLM accept.

Unknown fields are kept (extra="allow") and then sorted by `unsupported_fields`: an OpenAI field
that would change the answer and that minfer does not implement (audio, prediction, ...) is a 400
`unsupported_value` naming it, and so is one of llama.cpp's server's or vLLM's extensions that
would change the answer (grammar, mirostat, ignore_eos, ...: `_EXTENSIONS`, each with what to send
instead) -- those that name a field minfer has (n_predict, repeat_penalty, json_schema, guided_json)
are read as that field (_Sampling._other_servers_names); bookkeeping fields that do not change the answer (user, store, metadata,
cache_prompt, ...) are ignored, as OpenAI-compatible servers commonly do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator,
                      model_validator)

from minfer.limits import MAX_MESSAGES  # more messages get a 400 before any rendering

# OpenAI allows up to 4 stop sequences; llama.cpp's server takes any number. A bound keeps a
# hostile request from making the engine test thousands of strings after every token.
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


def _json_number(v: Any) -> Any:
    """Numbers must be JSON numbers, as in OpenAI's API: pydantic's lax mode would turn "5" into 5
    and true into 1, so a client's bug ("max_tokens": true) would silently become another request.
    An integral float (5.0) still passes for an integer field, as pydantic's lax mode allows."""
    if isinstance(v, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(v, str):
        raise ValueError("expected a number, got a string")
    return v


Int = Annotated[int, BeforeValidator(_json_number)]
Float = Annotated[float, BeforeValidator(_json_number)]
Bool = Annotated[bool, Strict()]   # true or false only, not "yes", 1 or "true"


def _seed_64_bits(v: int) -> int:
    """A seed is 64 bits, as SamplingParams takes it (sampling.SEED_MIN/SEED_MAX; that module
    imports torch): a larger one was a 400 naming no param and the CLI's --seed flag."""
    if not -(1 << 63) <= v <= (1 << 64) - 1:
        shown = f"a {v.bit_length()}-bit integer" if abs(v) >= 1 << 70 else str(v)
        raise ValueError(f"{shown} is outside 64 bits: expected an integer in {-(1 << 63)}..{(1 << 64) - 1}")
    return v


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Bool = False


class _Sampling(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: Annotated[Int, Field(ge=1)] | None = None
    temperature: Annotated[Float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] | None = None
    # 0 (and -1, llama.cpp's spelling) mean "no top-k cut"
    top_k: Annotated[Int, Field(ge=-1)] | None = None
    min_p: Annotated[Float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = None
    # logits are divided by it: one below float32's range (1e-300) made them inf, a 500 "NaN
    # probabilities" after the request was accepted; 1e-6 already multiplies a logit by a million
    repetition_penalty: Annotated[Float, Field(ge=1e-6)] | None = None
    seed: Annotated[Int, AfterValidator(_seed_64_bits)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: Bool = False
    stream_options: StreamOptions | None = None
    n: Int = 1
    # token id (as a string key, OpenAI's form) -> bias added to its logit, -100..100
    logit_bias: dict[str, Annotated[Float, Field(ge=-100.0, le=100.0)]] | None = None
    # vLLM's extensions (server/prompting.py says what each does). skip_special_tokens: true
    # leaves control tokens' text (<|im_start|> ...) out of the answer; false or null (minfer's
    # default) keeps it. The end-of-generation token that ends an answer is never text
    skip_special_tokens: Bool | None = None
    # BOS/EOS added when tokenizing the prompt (null: as the vocab says, true; false: none)
    add_special_tokens: Bool | None = None
    # minfer never spaces special tokens' text apart (false); vLLM's true does the same for the
    # fast tokenizers GGUF vocabs are, so both are read and answer alike
    spaces_between_special_tokens: Bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _other_servers_names(cls, data: Any) -> Any:
        """llama.cpp's server's and vLLM's names of fields minfer has, read as those fields, so a
        client written for them gets the answer it asked for (not a 400, not an ignored field):
        n_predict -> max_tokens (-1, llama-server's "no limit", is no value), repeat_penalty ->
        repetition_penalty, json_schema / guided_json (a schema object) -> response_format
        json_schema. Both names with different values is an error naming both."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for other, ours in (("n_predict", "max_tokens"), ("repeat_penalty", "repetition_penalty")):
            if other not in data:
                continue
            v = data.pop(other)
            if v is None or (other == "n_predict" and v == -1 and not isinstance(v, bool)):
                continue
            if data.get(ours) is not None and data[ours] != v:
                raise ValueError(f"{other} ({v!r}) and {ours} ({data[ours]!r}) disagree: send one of them")
            data[ours] = v
        for other in ("json_schema", "guided_json"):
            if other not in data or data[other] is None:
                data.pop(other, None)
                continue
            schema = data[other]
            if not isinstance(schema, dict):
                continue      # (a string or other: left for unsupported_fields to name)
            data.pop(other)
            rf = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
            if data.get("response_format") is not None and data["response_format"] != rf:
                raise ValueError(f"{other} and response_format both constrain the answer: send one of them")
            data["response_format"] = rf
        return data

    @field_validator("stream", "n", "logprobs", "echo", mode="before", check_fields=False)
    @classmethod
    def _null_is_default(cls, v: Any, info: Any) -> Any:
        # OpenAI's reference types these "boolean or null" / "integer or null" (its SDK and
        # clients that serialize every field send null for "not set"): a 400 "Input should be a
        # valid boolean" refused a request OpenAI answers. null is the default, as for the others
        return cls.model_fields[info.field_name].default if v is None else v

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, v: Any, info: Any) -> Any:
        # OpenAI answers 400 to stream_options without stream (so does vLLM); accepting it
        # silently left a client waiting for a usage chunk that a non-streamed answer never has.
        # (`stream` is declared before it: info.data holds it when it was valid)
        if v is not None and "stream" in info.data and not info.data["stream"]:
            raise ValueError("only allowed when stream is true")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]  # an empty stop string would match everywhere


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class OtherPart(BaseModel):
    """A content part of another type (image_url, input_audio, file, ...): accepted by the schema
    so that the answer can be a 400 `unsupported_value` naming it (tools.template_messages)."""

    model_config = ConfigDict(extra="allow")
    type: str

    @model_validator(mode="after")
    def _not_text(self) -> "OtherPart":
        if self.type == "text":  # a text part that failed TextPart (no `text`) stays an error
            raise ValueError('a "text" part needs a string `text`')
        return self


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = "{}"  # a JSON object, as a string (OpenAI's form)


class ToolCall(BaseModel):
    """An assistant message's earlier tool call, sent back by the client."""

    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # 'developer' is OpenAI's newer name for 'system'
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # a list of parts is OpenAI's multimodal form; only text parts are understood here
    content: str | list[TextPart | OtherPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: which call this answers

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        # OpenAI requires content but on an assistant turn (which may carry tool_calls only); a
        # null user message was rendered as an empty turn, and the model answered a question
        # nobody asked
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (a string, or a list of text parts); "
                             "it is null or missing")
        if isinstance(self.content, list) and not self.content:   # OpenAI: an array of at least 1 part
            raise ValueError("content is an empty list; give a string or at least one text part")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64 characters
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class ToolChoiceFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: ToolChoiceFunction


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    # 'schema' would shadow a BaseModel attribute, hence the alias
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError('type "json_schema" needs json_schema.schema (a JSON schema object)')
        return self


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    # OpenAI's newer name for max_tokens; it wins when both are given
    max_completion_tokens: Annotated[Int, Field(ge=1)] | None = None
    logprobs: Bool = False
    top_logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    # vLLM's extension: false renders the messages without the assistant's generation prompt, so
    # the model goes on from the last message as the template renders it (true or null: with it)
    add_generation_prompt: Bool | None = None
    # vLLM's extension: true leaves the last (assistant) message open, and the model continues it
    # (server/prompting.py; a 400 with add_generation_prompt true or another last role)
    continue_final_message: Bool | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, v, info):
        # OpenAI rejects top_logprobs without logprobs=true; so do we. A field validator (logprobs
        # is declared first, so it is in info.data) names the field in the error's param
        if v is not None and "logprobs" in info.data and not info.data["logprobs"]:
            raise ValueError("top_logprobs requires logprobs to be true")
        return v

    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def n_top_logprobs(self) -> int | None:
        """None: no logprobs; else the number of alternatives per token (0: only the chosen one)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    # a string, a list holding one string, or a list of token ids
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[Int], Field(min_length=1)]
    # completions' logprobs is the number of alternatives (OpenAI caps it at 5)
    logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: Bool = False
    # not in OpenAI's completions API; vLLM and llama.cpp's server take a JSON constraint here too
    response_format: "ResponseFormat | None" = None

    def max_new(self) -> int | None:
        return self.max_tokens

    def n_top_logprobs(self) -> int | None:
        return self.logprobs


# OpenAI request fields that change the answer and that minfer does not implement, with what a
# client can do instead. A field sent with its "off" value (null, false, [], ["text"]) is fine.
_UNSUPPORTED = {
    "audio": "audio output is not supported (text models only)",
    "modalities": 'only ["text"] output is supported',
    "prediction": "predicted outputs are not supported",
    "functions": "the deprecated `functions` field is not supported; send `tools` instead",
    "function_call": "the deprecated `function_call` field is not supported; send `tool_choice` instead",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "reasoning effort is not supported by this server",
    "verbosity": "verbosity is not supported by this server",
    "best_of": "best_of is not supported: this server returns exactly one completion (best_of=1)",
    "suffix": "suffix (fill-in-the-middle through the completions API) is not supported",
    "tools": "tools need a chat template: send them to /v1/chat/completions",
    "tool_choice": "tool_choice needs tools: send them to /v1/chat/completions",
}
_OFF_VALUES = (None, False, [], ["text"], 1)

# llama.cpp's server's and vLLM's request extensions that change the answer, which minfer does
# not read: a client written for those servers ("grammar", "n_predict") silently got another
# answer than it asked for. Each: (its values that change nothing, what to send instead).
_SAME_AS = "not read by this server; send `{}` (its OpenAI name) instead"
_NOT_HERE = "{} is not supported by this server"
_EXTENSIONS = {
    # (n_predict, repeat_penalty, json_schema and guided_json objects are read as OpenAI's fields:
    # _Sampling._other_servers_names; a json_schema / guided_json that is not an object lands here)
    "n_probs": ((0,), _SAME_AS.format("logprobs")),
    "json_schema": ((), "a JSON schema object is expected (or send response_format json_schema)"),
    "guided_json": ((), "a JSON schema object is expected (or send response_format json_schema)"),
    "grammar": (("",), _NOT_HERE.format("a GBNF grammar") + "; response_format json_schema constrains to JSON"),
    "guided_grammar": (("",), _NOT_HERE.format("a guided grammar") + "; response_format json_schema constrains to JSON"),
    "guided_regex": (("",), _NOT_HERE.format("guided_regex")),
    "guided_choice": ((), _NOT_HERE.format("guided_choice")),
    "repeat_last_n": ((64,), _NOT_HERE.format("repeat_last_n (the penalties look at the last 64 tokens)")),
    "ignore_eos": ((), _NOT_HERE.format("ignore_eos")),
    "min_tokens": ((0,), _NOT_HERE.format("min_tokens")),
    "typical_p": ((1,), _NOT_HERE.format("typical sampling")),
    "mirostat": ((0,), _NOT_HERE.format("mirostat sampling")),
    "tfs_z": ((1,), _NOT_HERE.format("tail-free sampling")),
    "dynatemp_range": ((0,), _NOT_HERE.format("dynamic temperature")),
    "dry_multiplier": ((0,), _NOT_HERE.format("DRY sampling")),
    "xtc_probability": ((0,), _NOT_HERE.format("XTC sampling")),
    "top_n_sigma": ((-1,), _NOT_HERE.format("top-n-sigma sampling")),
    "use_beam_search": ((), _NOT_HERE.format("beam search")),
    "stop_token_ids": ((), _NOT_HERE.format("stop_token_ids; send `stop` strings")),
    "bad_words": ((), _NOT_HERE.format("bad_words; `logit_bias` -100 bans a token")),
    # vLLM's and llama-server's prompt and output switches (a Qwen3 client's
    # {"enable_thinking": false} got the thinking answer without a word)
    "chat_template_kwargs": (({},), _NOT_HERE.format("chat_template_kwargs") + "; the model's chat template "
                             "renders with its own defaults"),
    "chat_template": (("",), _NOT_HERE.format("a chat template per request")),
    "include_stop_str_in_output": ((), _NOT_HERE.format("include_stop_str_in_output")),
    "prompt_logprobs": ((0,), _NOT_HERE.format("prompt_logprobs")),
}


# the other endpoint's fields, which this one does not read: sent here they were silently
# ignored (max_completion_tokens on /v1/completions generated max_tokens or the whole context;
# top_logprobs there gave no logprobs; echo on chat echoed nothing)
_OTHER_ENDPOINT = {   # each: (its values that change nothing, why), as _EXTENSIONS
    "ChatCompletionRequest": {
        "prompt": ((), "the chat API reads `messages`; send a prompt to /v1/completions"),
        "echo": ((), "echo is a /v1/completions field; the chat API does not echo the messages"),
    },
    "CompletionRequest": {
        "messages": ((), "/v1/completions reads `prompt`; send messages to /v1/chat/completions"),
        "max_completion_tokens": ((), "the chat API's name: send `max_tokens` to /v1/completions"),
        "top_logprobs": ((0,), "the chat API's name: on /v1/completions `logprobs` is the number of "
                               "alternatives"),
        "parallel_tool_calls": ((), "tools need a chat template: send them to /v1/chat/completions"),
        # (false is what /v1/completions does: the prompt is continued as sent)
        "continue_final_message": ((), "a chat field: /v1/completions continues the prompt as sent; send "
                                       "messages to /v1/chat/completions"),
        "add_generation_prompt": ((), "a chat field: /v1/completions renders no chat template, so there is "
                                      "no generation prompt to add; send messages to /v1/chat/completions"),
    },
}


def _is_off(value: Any, offs: tuple) -> bool:
    # bool is an int: true is not the value 1 here; 1 and 1.0 are the same number
    return any(value == off and isinstance(value, bool) == isinstance(off, bool) for off in offs)


def unsupported_fields(req: BaseModel) -> list[tuple[str, str]]:
    """[(field, why)] of the sent fields minfer would otherwise have to ignore silently."""
    out = []
    other = _OTHER_ENDPOINT.get(type(req).__name__, {})
    for name, value in (req.model_extra or {}).items():
        if name in other:
            offs, why = other[name]
            if not _is_off(value, (None, False, [], "") + offs):
                out.append((name, why))
            continue
        if name in _EXTENSIONS:
            offs, why = _EXTENSIONS[name]
            if not _is_off(value, (None, False, []) + offs):
                out.append((name, why))
            continue
        why = _UNSUPPORTED.get(name)
        if why is None or any(value == off and type(value) is type(off) for off in _OFF_VALUES):
            continue
        if name == "best_of" and value == 1:
            continue
        out.append((name, why))
    return out


CompletionRequest.model_rebuild()  # its response_format refers to ResponseFormat, defined after it
