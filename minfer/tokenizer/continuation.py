"""A chat rendered with its final (assistant) message left open, for the model to continue.

vLLM's `continue_final_message` and transformers' apply_chat_template(continue_final_message=
True): a chat template always closes every message it renders (<|im_end|>, <|eot_id|> ...), and
has no variable for "leave the last one open". So, as transformers does
(utils/chat_template_utils.py, render_jinja_template), the chat is rendered without the
generation prompt and the text is cut right after the final message's content, found as its
last occurrence in the rendered text. Differences from transformers, each where it would
return a wrong prompt:
- the content's trailing whitespace stays when the template kept it (transformers keeps it only
  for content without leading whitespace), and goes when the template trimmed it (Llama 3's
  `| trim`);
- empty or whitespace-only content (transformers found "" at the very end, so the message was
  not left open) is located by rendering a unique placeholder in its place.
A template that changes the content so it cannot be found is an error, not a guess.
"""

from __future__ import annotations

import secrets
from typing import Callable

from minfer.errors import MinferError

Render = Callable[[list[dict]], str]   # messages -> the rendered chat (no generation prompt)


class ContinuationError(MinferError):
    """The final message cannot be left open: not an assistant message, or its content is not
    found in the rendered chat."""


def open_final_message(render: Render, messages: list[dict]) -> str:
    """`render(messages)` cut right after the final message's content (see the module doc)."""
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "assistant":
        role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
        raise ContinuationError(f"continue_final_message: the last message must be an assistant message "
                                f"to continue, and it is {'a ' + repr(role) if role else 'not one'} message")
    content = messages[-1].get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ContinuationError("continue_final_message: the final message's content must be a string")
    if not content.strip():
        return _open_by_placeholder(render, messages, content)
    text = render(messages)
    core = content.strip()
    at = text.rfind(core)
    if at < 0:
        raise ContinuationError(
            "continue_final_message: the final message's content does not appear in the chat as the "
            "chat template renders it (the template changes it), so minfer cannot tell where to leave "
            "the message open")
    tail = content.lstrip()       # the content from its first non-space character
    end = at + len(tail) if text.startswith(tail, at) else at + len(core)
    return text[:end]


def _open_by_placeholder(render: Render, messages: list[dict], content: str) -> str:
    """An empty or whitespace-only final message: rendered with a unique placeholder in its
    place, the real text must be that rendering with the placeholder replaced by the content (as
    is, or stripped); the cut is where the content ends."""
    mark = f"\ue000minfer-open-{secrets.token_hex(8)}\ue001"
    shaped = render(messages[:-1] + [dict(messages[-1], content=mark)])
    text = render(messages)
    if shaped.count(mark) == 1:
        at = shaped.index(mark)
        for shown in (content, content.strip()):
            if shaped.replace(mark, shown) == text:
                return text[:at + len(shown)]
    raise ContinuationError(
        "continue_final_message: the final message is empty and the chat template does not render "
        "its content where minfer can find it, so minfer cannot tell where to leave the message open")
