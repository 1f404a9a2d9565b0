"""Write tests/data/templates/openai-gpt-oss-120b.renders.json: transformers' renders of gpt-oss's
harmony chat template (tests/data/templates/openai-gpt-oss-120b.jinja) for the conversations of
tests/tokenizer/test_tok_harmony_template.py (CASES, plus EXTRA_CASES there), the independent
reference of that test. transformers is a tool dependency only: CI reads the committed file.

    pip install transformers
    python tools/gen_harmony_goldens.py

The template writes today's date (strftime_now("%Y-%m-%d")); the renders store it as {DATE},
and the test puts the day it runs back in. Written with transformers 5.25.0 (render_jinja_template,
the apply_chat_template path); the raise_exception case stores the message transformers raised.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tokenizer"))

import transformers  # noqa: E402
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

from test_tok_harmony_template import CASES, EXTRA_CASES, RENDERS, T  # noqa: E402


def render(messages, agp, extra) -> str:
    extra = dict(extra)
    tools = extra.pop("tools", None)
    out = render_jinja_template([messages], tools=tools, chat_template=T, add_generation_prompt=agp, **extra)
    return out[0][0]


def main():
    today = datetime.datetime.now().strftime("%Y-%m-%d")
    renders = {}
    for name, (messages, agp, extra) in {**CASES, **EXTRA_CASES}.items():
        text = render(messages, agp, extra)
        assert text.count(today) == 1, (name, "the date must appear once to be replaced")
        renders[name] = text.replace(today, "{DATE}")
    try:
        render([{"role": "tool", "content": "x"}], True, {})
        raise SystemExit("the lone tool message rendered: the template should have raised")
    except Exception as e:      # jinja2's TemplateError via raise_exception
        raised = str(e)
    out = {"transformers": transformers.__version__, "renders": renders, "lone_tool_raises": raised}
    RENDERS.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {RENDERS} ({len(renders)} renders)")


if __name__ == "__main__":
    main()
