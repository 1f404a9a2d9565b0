"""Chat templates (Jinja, stored in GGUF as tokenizer.chat_template), rendered as HF does.

HuggingFace transformers renders templates in an ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loop-controls extension, a `tojson` filter that
keeps non-ASCII characters (ensure_ascii=False) and takes `indent`, and the globals
`raise_exception` and `strftime_now` (transformers: utils/chat_template_utils.py,
_compile_jinja_template). Templates are written against that environment, so minfer gives
them the same one.

A file without a template gets ChatML, the fallback llama.cpp uses too
(common/chat.cpp: CHATML_TEMPLATE_SRC).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from minfer.errors import MinferError

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


class TemplateError(MinferError):
    """A chat template failed to compile or render, or raised on purpose."""


def _raise_exception(message):
    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's filter: json.dumps with ensure_ascii=False; the result is not HTML-escaped
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", source: str = "chat template",
                **extra) -> str:
    """Render `messages` ([{'role': ..., 'content': ...}, ...]) with a Jinja chat template.

    `extra` is passed to the template as further variables (e.g. tools=[...]), as HF's
    apply_chat_template passes its kwargs. Any failure is a MinferError naming `source`.
    """
    import jinja2

    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise MinferError(f"{source}: messages must be a list of dicts with 'role' and "
                          "'content'")
    try:
        tmpl = _compile(template)
    except jinja2.TemplateError as e:
        raise TemplateError(f"{source}: the template does not compile: {e}") from e
    try:
        return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           bos_token=bos_token, eos_token=eos_token, **extra)
    except TemplateError as e:
        raise TemplateError(f"{source}: {e}") from e
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise TemplateError(f"{source}: rendering failed: {type(e).__name__}: {e}") from e
