"""Chat formats for vocabs whose GGUF has no tokenizer.chat_template.

llama.cpp's own fallback is ChatML (common/chat.cpp: CHATML_TEMPLATE_SRC), which writes
<|im_start|> as plain text for a model that never saw it. minfer instead picks the family's
format by the turn markers its vocab holds as special tokens, and writes it as a Jinja
template equal to llama.cpp's built-in C++ rendering of that format (src/llama-chat.cpp,
llm_chat_apply_template, commit 0c1e57098 vendored in llama-cpp-python 0.3.36). Content is
trimmed where llama.cpp trims it (its trim(): ASCII whitespace; Jinja's trim strips Unicode
whitespace too, which only differs for content that starts or ends with such characters).
A vocab with none of these markers gets ChatML, as in llama.cpp.
"""

from __future__ import annotations

# LLM_CHAT_TEMPLATE_GEMMA (google/gemma-7b-it and later): no system role -- system texts are
# merged into the next user turn; "assistant" is "model"
GEMMA = (
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for m in messages -%}\n"
    "  {%- if m.role == 'system' -%}\n"
    "    {%- set ns.system = ns.system + (m.content | trim) -%}\n"
    "  {%- else -%}\n"
    "    {%- set role = 'model' if m.role == 'assistant' else m.role -%}\n"
    "    {{- '<start_of_turn>' + role + '\\n' -}}\n"
    "    {%- if ns.system and role != 'model' -%}\n"
    "      {{- ns.system + '\\n\\n' -}}\n"
    "      {%- set ns.system = '' -%}\n"
    "    {%- endif -%}\n"
    "    {{- (m.content | trim) + '<end_of_turn>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

# LLM_CHAT_TEMPLATE_PHI_3
PHI_3 = (
    "{%- for m in messages -%}\n"
    "  {{- '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# LLM_CHAT_TEMPLATE_LLAMA_3
LLAMA_3 = (
    "{%- for m in messages -%}\n"
    "  {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (m.content | trim)"
    " + '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# LLM_CHAT_TEMPLATE_COMMAND_R (roles other than system/user/assistant are left out)
COMMAND_R = (
    "{%- set names = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>',"
    " 'assistant': '<|CHATBOT_TOKEN|>'} -%}\n"
    "{%- for m in messages if m.role in names -%}\n"
    "  {{- '<|START_OF_TURN_TOKEN|>' + names[m.role] + (m.content | trim)"
    " + '<|END_OF_TURN_TOKEN|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)

# (name, special-token texts the vocab must hold, template), first match wins
FORMATS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("gemma", ("<start_of_turn>", "<end_of_turn>"), GEMMA),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), LLAMA_3),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"), COMMAND_R),
    ("phi3", ("<|user|>", "<|assistant|>", "<|end|>"), PHI_3),
)


def fallback_template(special_texts: set[str]) -> tuple[str, str]:
    """(format name, Jinja template) for a vocab whose special tokens are `special_texts`."""
    from minfer.tokenizer.chat_template import CHATML_TEMPLATE

    for name, markers, tmpl in FORMATS:
        if all(m in special_texts for m in markers):
            return name, tmpl
    return "chatml", CHATML_TEMPLATE
