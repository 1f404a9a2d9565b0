"""Write tests/models/goldens/<model>.json from llama.cpp's own forward pass.

The independent reference for minfer's CPU engine: llama.cpp tokenizes the prompt, runs it
(CPU, its own quantized matmuls), and we record
  - greedy continuation ids (argmax of llama.cpp's logits, 16 tokens) and their text,
  - the top-10 logits at the last prompt position,
  - perplexity NLLs by llama-perplexity's protocol (chunks of 128 tokens of
    tests/models/data/textwrap_py3117.txt, second half scored) for the first 2 chunks.
Nothing here imports minfer.

Needs llama.cpp's shared library with llama-cpp-python's bindings (the venv at /tmp/llcpp,
see tests/tokenizer/README.md):

    /tmp/llcpp/bin/python tools/gen_engine_goldens.py
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "models" / "goldens"
TEXT = ROOT / "tests" / "models" / "data" / "textwrap_py3117.txt"
MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
PROMPT = "The capital of France is"
N_GREEDY = 16
PPL_CTX = 128
PPL_CHUNKS = 2


def model_path(name: str) -> Path:
    home = Path(os.environ.get("MINFER_HOME", Path.home() / ".cache" / "minfer"))
    return home / "models" / f"{name}.gguf"


def main() -> int:
    import llama_cpp

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        llm = llama_cpp.Llama(str(model_path(name)), n_ctx=512, n_batch=512, logits_all=True,
                              n_threads=2, verbose=False)
        add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))
        bos = llm.token_bos()
        prompt_ids = llm.tokenize(PROMPT.encode(), add_bos=bool(add_bos), special=True)
        llm.reset()
        llm.eval(prompt_ids)
        last = np.array(llm.scores[len(prompt_ids) - 1], dtype=np.float64)
        top = np.argsort(-last)[:10]
        ids = []
        for _ in range(N_GREEDY):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            ids.append(t)
            llm.eval([t])
        text = llm.detokenize(ids).decode("utf-8", errors="replace")

        toks = llm.tokenize(TEXT.read_bytes(), add_bos=bool(add_bos), special=True)
        nlls = []
        for c in range(PPL_CHUNKS):
            chunk = list(toks[c * PPL_CTX:(c + 1) * PPL_CTX])
            if add_bos:
                chunk[0] = bos
            llm.reset()
            llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
            llm.eval(chunk)
            first = PPL_CTX // 2
            for j in range(first, PPL_CTX - 1):
                x = np.array(llm.scores[j], dtype=np.float64)
                m = x.max()
                lse = m + math.log(np.exp(x - m).sum())
                nlls.append(lse - x[chunk[j + 1]])
        out = {
            "llama_cpp": "llama-cpp-python " + llama_cpp.__version__,
            "model": name, "prompt": PROMPT, "prompt_ids": list(map(int, prompt_ids)),
            "greedy_ids": ids, "greedy_text": text,
            "last_top_ids": [int(i) for i in top], "last_top_logits": [float(last[i]) for i in top],
            "ppl_ctx": PPL_CTX, "ppl_chunks": PPL_CHUNKS, "ppl_n_tokens": len(toks),
            "ppl_nll_sum": float(sum(nlls)), "ppl_count": len(nlls),
            "ppl": math.exp(sum(nlls) / len(nlls)),
        }
        (OUT_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(name, repr(text), out["ppl"], file=sys.stderr)
        del llm
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
