"""Request bodies of the OpenAI-compatible endpoints, as pydantic v2 models.

Only the requests are modelled: pydantic turns a wrong type, a missing field or an out-of-range
value into a RequestValidationError, which app.py answers with an OpenAI-style 400 error object.
Responses are plain dicts built in app.py (they are ours, so validating them buys nothing).

Field names and ranges follow OpenAI's API reference (platform.openai.com/docs/api-reference:
chat/create, completions/create); the non-OpenAI sampling fields (top_k, min_p,
repetition_penalty) use the names llama.cpp's server and vLLM accept. Unknown fields are
ignored, as OpenAI-compatible servers commonly do, so that clients sending e.g. `user` work.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# OpenAI allows up to 4 stop sequences; llama.cpp's server takes any number. A bound keeps a
# hostile request from making the engine test thousands of strings after every token.
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # 0 (and -1, llama.cpp's spelling) mean "no top-k cut"
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]  # an empty stop string would match everywhere


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # 'developer' is OpenAI's newer name for 'system'
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # a list of parts is OpenAI's multimodal form; only text parts are understood here
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # OpenAI's newer name for max_tokens; it wins when both are given
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        # OpenAI rejects top_logprobs without logprobs=true; so do we
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def n_top_logprobs(self) -> int | None:
        """None: no logprobs; else the number of alternatives per token (0: only the chosen one)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    # a string, a list holding one string, or a list of token ids
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]
    # completions' logprobs is the number of alternatives (OpenAI caps it at 5)
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False

    def max_new(self) -> int | None:
        return self.max_tokens

    def n_top_logprobs(self) -> int | None:
        return self.logprobs
