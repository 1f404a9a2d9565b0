"""Write tests/models/goldens/gemma-3-270m.json: llama.cpp's own answers on the real gemma-3-270m.

The reference for tests/models/test_gemma_vs_llamacpp.py. Everything here comes from
llama.cpp 0c1e57098 (the one vendored by the llama-cpp-python 0.3.36 sdist), built for the
CPU, run on the same GGUF file minfer reads (and on an F32 copy of it); nothing here imports
minfer.

  - prompt_ids: `llama-tokenize --ids` of the raw prompt (BOS added, as the vocab says);
  - text_ids: `llama-tokenize --ids --no-escape -f` of tests/models/data/textwrap_py3117.txt;
  - then, for the file itself ("q4_k_m") and for a copy with every tensor dequantized to F32
    by gguf-py ("f32", see write_f32_copy; the copy is deleted afterwards):
    - greedy_ids: the argmax of llama.cpp's logits, token after token (llama.cpp's context
      driven through llama-cpp-python's ctypes bindings loaded on the libllama.so built
      here), with llama.cpp's top-2 logits at every step (how close each choice was);
    - greedy_text: what `llama-completion --temp 0 --top-k 1` prints for the same prompt; the
      script checks it equals the detokenized greedy_ids (the binary's sampler and the
      bindings' argmax pick the same tokens);
    - ppl: `llama-perplexity --no-escape -c 128 -b 128 --chunks 2` on that text (the test's
      short run) and `-c 512 -b 512 --chunks 4` (the README row), flash attention on (the
      CPU default) and, for the quantized file, off as well.

Build (outside the repo; 8 min on 2 shared cores here), from the sdist tools/fetch_llama_cpp.py fetches:

    pip download --no-deps --no-binary :all: -d /work/llama-build llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz; cd llama_cpp_python-0.3.36/vendor/llama.cpp
    # tools/CMakeLists.txt trimmed to: llama-bench, completion, perplexity, tokenize
    # AMX off: the build machine's cpuinfo lists amx, but its tile instructions SIGILL there
    cmake -B build -G Ninja -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release \\
        "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \\
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    nice -n 10 cmake --build build -j2 --target llama-tokenize llama-perplexity llama-completion llama-bench

Run (a Python with numpy, jinja2, typing_extensions and diskcache, which the bindings import):

    LLAMA_BIN=.../llama.cpp/build/bin \\
    PYTHONPATH=.../llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=$LLAMA_BIN \\
    GOLDEN_TMP=<a folder with 1.1 GB free for the F32 copy> \\
        python tools/gen_gemma_goldens.py     # ~4 min on 2 shared cores
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "models" / "goldens" / "gemma-3-270m.json"
TEXT = ROOT / "tests" / "models" / "data" / "textwrap_py3117.txt"
NAME = "gemma-3-270m"
PROMPT = "The capital of France is"
N_GREEDY = 32
PPL_RUNS = {"test": (128, 2), "readme": (512, 4)}   # (-c, --chunks)


def model_path() -> Path:
    home = Path(os.environ.get("MINFER_HOME", Path.home() / ".cache" / "minfer"))
    return home / "models" / f"{NAME}.gguf"


def run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout + "\n" + res.stderr


def tokenize_ids(binary: Path, model: str, args: list[str]) -> list[int]:
    out = subprocess.run([str(binary), "-m", model, "--ids", "--log-disable", "--no-escape", *args],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def write_f32_copy(src: str, dst: Path) -> None:
    """The same model with every tensor dequantized to F32 by gguf-py (no minfer code): on F32
    weights llama.cpp's CPU matmuls keep the activations in F32 (ggml-cpu: vec_dot_type of F32
    is F32), where on Q4_K/Q6_K they are quantized to 8 bits (Q8_K) first. minfer's float32
    reference dequantizes the same blocks to the same F32 values, so this run shows how much of
    the gap to llama.cpp on the quantized file is llama.cpp's 8-bit activations."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY else None
        val = f.contents()
        if key == "general.file_type":
            val = 0  # LLAMA_FTYPE_ALL_F32
        w.add_key_value(key, val, vtype, sub_type=sub)
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, x.reshape([int(d) for d in reversed(t.shape)]),
                     raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy(model: str, prompt_ids: list[int]) -> tuple[list[int], list[list], str]:
    """llama.cpp's greedy continuation through the bindings: ids, [top1, logit, top2, logit] per
    step, text. flash_attn on, as llama-completion's default (auto) picks on the CPU."""
    import llama_cpp

    llm = llama_cpp.Llama(model, n_ctx=256, n_batch=256, logits_all=True, n_threads=2,
                          flash_attn=True, verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    assert list(llm.tokenize(PROMPT.encode(), add_bos=add_bos, special=True)) == prompt_ids
    llm.reset()
    llm.eval(prompt_ids)
    ids, top2 = [], []
    for _ in range(N_GREEDY):
        x = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        a, b = np.argsort(-x)[:2]
        ids.append(int(a))
        top2.append([int(a), float(x[a]), int(b), float(x[b])])
        llm.eval([int(a)])
    text = llm.detokenize(ids).decode("utf-8")
    del llm
    return ids, top2, text


def runs(bin_dir: Path, model: str, label: str, prompt_ids: list[int], commands: dict,
         fa_off: bool) -> dict:
    """Greedy (bindings, checked against llama-completion) and perplexity (llama-perplexity)."""
    ids, top2, text = greedy(model, prompt_ids)
    cmd = [str(bin_dir / "llama-completion"), "-m", model, "-p", PROMPT, "-n", str(N_GREEDY),
           "--temp", "0", "--top-k", "1", "-t", "2", "-c", "256", "-no-cnv", "--no-escape",
           "--no-display-prompt", "--no-warmup", "--seed", "1"]   # (--log-disable would hide the text too)
    commands[f"{label}.greedy_text"] = " ".join(["llama-completion", "-m", Path(model).name,
                                                 "-p", f"'{PROMPT}'", *cmd[5:]])
    completion = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if completion.rstrip("\n") != text:
        raise RuntimeError(f"{label}: llama-completion printed {completion!r}, the bindings' "
                           f"argmax gives {text!r}")
    ppl = {}
    for key, (c, chunks) in PPL_RUNS.items():
        for fa in ("on", "off") if fa_off else ("on",):
            # --no-escape: llama-perplexity reads the file verbatim anyway (perplexity.cpp sets
            # params.escape = false); llama-tokenize does not, and would turn the \n, \t ...
            # spelled in textwrap.py's string literals into control characters (5,054 tokens
            # instead of the file's 5,070). -fa on: what the default (auto) picks on the CPU.
            argv = ["-f", str(TEXT), "-c", str(c), "-b", str(c), "--chunks", str(chunks), "-t", "2",
                    "--no-escape", "-fa", fa]
            out = run([str(bin_dir / "llama-perplexity"), "-m", model, *argv])
            m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
            running = re.findall(r"\[(\d+)\]([0-9.]+),", out)
            k = key if fa == "on" else f"{key}_fa_off"
            ppl[k] = {"ctx": c, "chunks": chunks, "ppl": float(m.group(1)), "err": float(m.group(2)),
                      "running": [float(v) for _, v in running],
                      "command": " ".join(["llama-perplexity", "-m", Path(model).name,
                                           "-f", str(TEXT.relative_to(ROOT)), *argv[2:]])}
            print(label, k, ppl[k]["ppl"], ppl[k]["err"], file=sys.stderr)
    print(label, ids, repr(text), file=sys.stderr)
    return {"greedy_ids": ids, "greedy_text": text, "greedy_top2": top2, "ppl": ppl}


def main() -> int:
    bin_dir = Path(os.environ["LLAMA_BIN"])
    model = str(model_path())
    commands = {}

    commands["prompt_ids"] = f"llama-tokenize -m {NAME}.gguf --ids --log-disable --no-escape -p '{PROMPT}'"
    prompt_ids = tokenize_ids(bin_dir / "llama-tokenize", model, ["-p", PROMPT])
    commands["text_ids"] = f"llama-tokenize -m {NAME}.gguf --ids --log-disable --no-escape -f {TEXT.relative_to(ROOT)}"
    text_ids = tokenize_ids(bin_dir / "llama-tokenize", model, ["-f", str(TEXT)])

    out = {
        "llama_cpp": "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36 sdist), CPU build (AVX-512, "
                     "no AMX), 2 threads",
        "model": NAME, "prompt": PROMPT, "prompt_ids": prompt_ids,
        "text": str(TEXT.relative_to(ROOT)), "text_ids": text_ids,
        "q4_k_m": runs(bin_dir, model, "q4_k_m", prompt_ids, commands, fa_off=True),
    }
    with tempfile.TemporaryDirectory(dir=os.environ.get("GOLDEN_TMP")) as tmp:
        f32 = Path(tmp) / f"{NAME}-f32.gguf"
        write_f32_copy(model, f32)
        out["f32"] = runs(bin_dir, str(f32), "f32", prompt_ids, commands, fa_off=False)
    out["commands"] = commands
    text = json.dumps(out, indent=1)
    # number lists on one line each (5,070 text ids would be 5,070 lines)
    text = re.sub(r"\[[-0-9.e,\s]+\]", lambda m: re.sub(r"\s+", " ", m.group(0)), text)
    OUT.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
