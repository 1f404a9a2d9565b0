"""minfer: GGUF language models from Python, on the CPU (reference) and NVIDIA GPUs (Triton).

    import minfer
    with minfer.load("smollm2-135m-instruct") as eng:     # catalog name or .gguf path
        eng.complete("The capital of France is", max_tokens=16, temperature=0)   # -> str
        eng.chat([{"role": "user", "content": "Say hi"}], max_tokens=32, seed=1)  # -> str
        ids = eng.tokenizer.encode("Once upon a time")
        for ev in eng.generate(ids, max_new_tokens=32, top_logprobs=2):           # streaming
            print(ev.text, end="")    # ev.token_id, ev.logprob, ev.top_logprobs, ev.finish_reason

minfer.load(model, device=None, ctx=None) -> Engine (help(minfer.load)); the Engine's calls:
complete(prompt, max_tokens, stop, **sampling), chat(messages, max_tokens, stop, **sampling),
generate(prompt_ids, max_new_tokens, stop, top_logprobs, **sampling), logits(ids), close(),
and .stats (finish_reason, token counts, times) after each (help(minfer.Engine)). Sampling keywords: temperature (0 = greedy), top_k, top_p, min_p,
repeat_penalty, presence_penalty, frequency_penalty, penalty_last_n, seed
(minfer.SamplingParams). Every bad argument or file is a minfer.MinferError.
"""

from minfer.api import load
from minfer.errors import MinferError

__version__ = "0.1.0"

__all__ = ["Engine", "MinferError", "SamplingParams", "load", "__version__"]


def __getattr__(name: str):
    # Engine and SamplingParams import torch: only when asked for, so that `import minfer` (and
    # every `minfer ...` command's start) stays free of it.
    if name == "Engine":
        from minfer.runtime.engine import Engine

        return Engine
    if name == "SamplingParams":
        from minfer.runtime.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'minfer' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"Engine", "SamplingParams"})   # tab completion sees them too
