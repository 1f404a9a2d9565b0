"""llama.cpp's perplexity of a GGUF model on a text, by llama-perplexity's protocol, through
llama-cpp-python's bindings (an independent reference for `minfer perplexity`).

Protocol (llama.cpp tools/perplexity/perplexity.cpp, perplexity()): tokenize the whole file
with BOS when the vocab adds one; non-overlapping chunks of n_ctx tokens; each chunk from an
empty KV cache with its first token replaced by BOS when add_bos; score logits
[n_ctx/2, n_ctx-1) against the next tokens; PPL = exp(mean NLL), error = PPL *
sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).

    /tmp/llcpp/bin/python tools/llamacpp_perplexity.py MODEL.gguf TEXT [-c 512] [--chunks N]

or on the llama.cpp CPU build of tools/gen_gemma_goldens.py (its shared library, the sdist's
Python package): PYTHONPATH=<sdist> LLAMA_CPP_LIB_PATH=<build/bin> python tools/llamacpp_perplexity.py ...
The bindings create the context with flash attention off (Llama(flash_attn=False)); the
llama-perplexity binary's default on the CPU is on. On gemma-3-270m the two differ by 1.4% at
-c 128 (20.7963 vs 21.1017), on the F32-dequantized copy not at all, so say which one a figure is.
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("-c", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=-1)
    a = ap.parse_args()
    llm = llama_cpp.Llama(a.model, n_ctx=a.c, n_batch=a.c, logits_all=True, n_threads=2, verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    toks = llm.tokenize(open(a.text, "rb").read(), add_bos=add_bos, special=True)
    n_chunks = len(toks) // a.c if a.chunks < 0 else min(a.chunks, len(toks) // a.c)
    nll = nll2 = 0.0
    count = 0
    first = a.c // 2
    for i in range(n_chunks):
        chunk = list(toks[i * a.c:(i + 1) * a.c])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        for j in range(first, a.c - 1):
            x = np.asarray(llm.scores[j], dtype=np.float64)
            m = x.max()
            v = m + math.log(np.exp(x - m).sum()) - x[chunk[j + 1]]
            nll += v
            nll2 += v * v
            count += 1
        print(f"[{i + 1}]{math.exp(nll / count):.4f},", end="", flush=True)
    print()
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    print(f"llama.cpp ({llama_cpp.__version__}) Final estimate: PPL = {ppl:.4f} +/- "
          f"{math.sqrt((mean2 - mean * mean) / (count - 1)) * ppl:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
