"""vLLM's prompt and output switches, read from a request: how the prompt is rendered and
tokenized, and whether control tokens' text is in the answer.

- continue_final_message (chat): the last message, an assistant one, is left open and the model
  goes on with it (minfer/tokenizer/continuation.py); no generation prompt follows. With
  add_generation_prompt sent true, or a last message of another role, it is a 400.
- add_generation_prompt false (chat): the messages as the template renders them, no assistant
  generation prompt.
- add_special_tokens: whether tokenizing the prompt adds the vocab's BOS/EOS (as its
  add_bos_token / add_eos_token metadata say; a BOS the chat template wrote itself is kept
  once). null is minfer's default, which is true: the same as llama.cpp's server, and for chat
  the same prompt as vLLM's default false wherever the template writes the BOS (Llama 3,
  Gemma, Mistral) or the vocab adds none (Qwen, ChatML). false: only what the template (or the
  prompt text) writes. A prompt of token ids is used as sent: true is a 400 there.
- skip_special_tokens: true leaves control tokens' text (GGUF token type 3, and unknown
  tokens: <|im_start|>, <|endoftext|> ...) out of the answer, streamed and not, and out of
  what stop strings see; user-defined tokens (type 4: Qwen's <tool_call>, <think>) stay text,
  as vLLM's skip keeps added tokens that are not special. false or null (minfer's default,
  unchanged): their text stays. The end-of-generation token is never text. With tools to parse
  and a vocab whose <tool_call> tag is a control token, true is a 400 (the calls would vanish).
- spaces_between_special_tokens: minfer never puts spaces around special tokens' text, which is
  what false asks for; vLLM's default true answers the same for the fast tokenizers GGUF
  vocabs are (vLLM applies it in its slow-tokenizer detokenizer only), so both are accepted.
"""

from __future__ import annotations

from typing import Any

from minfer.server.tools import ToolError


def chat_prompt_options(req: Any) -> dict[str, Any]:
    """chat_token_ids' keywords for a chat request (add_generation_prompt,
    continue_final_message, add_special); a ToolError (400 naming the field) when they clash."""
    opts: dict[str, Any] = {}
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise ToolError("continue_final_message", "continue_final_message and add_generation_prompt are "
                            "both true: a continued message gets no generation prompt after it; send "
                            "add_generation_prompt false (or leave it out)")
        i, last = len(req.messages) - 1, req.messages[-1]
        if last.role != "assistant":
            raise ToolError("continue_final_message", f"continue_final_message: the last message "
                            f"(messages[{i}]) is a {last.role} message; only an assistant message can be "
                            "continued (or leave continue_final_message out for a new answer)")
        if last.tool_calls:
            raise ToolError("continue_final_message", f"continue_final_message: the last message "
                            f"(messages[{i}]) has tool_calls; only its text content could be continued")
        opts["continue_final_message"] = True
        opts["add_generation_prompt"] = False
    elif req.add_generation_prompt is False:
        opts["add_generation_prompt"] = False
    if req.add_special_tokens is False:
        opts["add_special"] = False
    return opts


def completion_add_special(req: Any) -> bool | None:
    """encode()'s add_bos for a /v1/completions text prompt (None: the vocab's default)."""
    prompt = req.prompt
    if isinstance(prompt, list) and isinstance(prompt[0], int) and req.add_special_tokens:
        raise ToolError("add_special_tokens", "add_special_tokens: a prompt of token ids is used as sent, "
                        "nothing is added to it; send the BOS id in the prompt, or a text prompt")
    return False if req.add_special_tokens is False else None


def encode_prompt(tok: Any, text: str, add_special: bool | None = None) -> list[int]:
    """A completions prompt's ids: control-token texts in it are tokens, as llama.cpp's server
    reads a prompt; BOS/EOS as `add_special` says (encode's add_bos)."""
    ids = list(tok.encode(text, add_bos=add_special)) if add_special is not None else list(tok.encode(text))
    # a prompt that writes the BOS token itself plus a tokenizer that adds one gives two;
    # llama.cpp's server warns about it, we drop the duplicate
    bos = getattr(tok, "bos_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def skip_special(req: Any) -> bool:
    """Whether the answer leaves control tokens' text out (skip_special_tokens true)."""
    return req.skip_special_tokens is True


def check_tool_tags_kept(tok: Any, req: Any) -> None:
    """An answer parsed for tool calls needs its <tool_call> tags' text: where the vocab has one
    as a control token, skip_special_tokens true would leave the calls unseen (vLLM's Hermes
    parser turns the switch off; here it is a 400 naming it). Qwen's tags are user-defined
    tokens, text either way."""
    from minfer.server.tools import CLOSE, OPEN
    from minfer.tokenizer import vocab as V

    if not skip_special(req) or not hasattr(tok, "token_attr"):
        return
    for tag in (OPEN, CLOSE):
        ids = tok.encode(tag, add_bos=False, parse_special=True)
        if len(ids) == 1 and tok.token_attr(ids[0]) & (V.ATTR_CONTROL | V.ATTR_UNKNOWN):
            raise ToolError("skip_special_tokens", f"skip_special_tokens: this model's {tag} is a control "
                            "token, whose text a true value drops, and tool calls are read from it; send "
                            "false (or leave it out) with tools")
