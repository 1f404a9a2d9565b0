"""Make the nanbeige fixture: a tiny random Nanbeige (NanbeigeForCausalLM, Nanbeige4.2-3B's architecture, a
remote-code model with no class in transformers 5.25) checkpoint in the Llama layout, converted to GGUF by llama.cpp's
own converter (conversion/nanbeige.py NanbeigeModel, a LlamaModel), with two references: a torch forward of the HF
checkpoint written here from the architecture (below), and llama.cpp's own logits (llama-cpp-python) on an F32 copy
of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_nanbeige_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_nanbeige_fixture.py goldens

`build` writes, under tests/data/arch/:
  nanbeige.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (weights drawn float16-exact).
  nanbeige.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,),
                 greedy (N,): its greedy continuation; logits_skip (T, V): the same forward with
                 skip_loop_final_norm true (no output norm between the loops).
  nanbeige.json  the config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention);
lc_logits_skip: llama.cpp on that copy with nanbeige.skip_loop_final_norm set true.

The architecture (conversion/nanbeige.py; src/models/nanbeige.cpp), as the reference computes it on the HF tensors:
Llama's layer (RMSNorm, q/k/v/o without bias, rotate_half rope base rope_theta on the HF rows, GQA with kv head
i // (H / KV), softmax(q k / sqrt(Dh)), SwiGLU MLP), the NUM_LOOPS = 2 physical layers run num_loops times over
shared weights (nanbeige.cpp: layers[i + j * n_phys] = layers[i]), the final norm model.norm applied to the
residual between two loops (the graph's "loop_norm", unless skip_loop_final_norm) and once at the end, an untied
lm_head.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rel_err, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "nanbeige"
SEED = 2026
VOCAB, D, H, KV, DH, FFN, LAYERS, LOOPS = 320, 64, 4, 2, 16, 96, 2, 2
THETA, EPS = 70e6 / 1000, 1e-5       # rope base: 70000 (the release's is 7e7; a small one turns in 40 positions)
SEQ, PROMPT, NEW = 40, 8, 16


def hf_config() -> dict:
    return {"architectures": ["NanbeigeForCausalLM"], "model_type": "nanbeige", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu", "max_position_embeddings": 256,
            "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None, "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "num_loops": LOOPS, "skip_loop_final_norm": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.embed_tokens.weight": torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
        t[p + "self_attn.k_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.v_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int], skip_loop_norm: bool = False) -> np.ndarray:
    """Nanbeige's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    rope = neox_rope(T, DH, THETA)                # rotate_half on the HF rows
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for loop in range(LOOPS):
        for i in range(LAYERS):                   # the same weights every loop; each pass attends its own keys
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], EPS)
            q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
            k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, DH))
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, DH)
            x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], EPS)
            m = p + "mlp."
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
        if loop + 1 < LOOPS and not skip_loop_norm:
            x = rms_norm(x, w["model.norm.weight"], EPS)    # the loop norm: the final norm's weight
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids),
              "logits_skip": reference(t, ids, skip_loop_norm=True)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config()},
           lambda x: reference(t, x), PROMPT, NEW)


def gguf_copy(src: Path, dst: Path, keys: dict | None = None, drop=(), add: dict | None = None) -> None:
    """A copy of a GGUF (gguf-py) with keys {key: (value, GGUFValueType)} set (after the others), the tensors named
    in drop left out and add's {name: array} appended as float32 tensors."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    keys, add = keys or {}, add or {}
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in keys:
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1] if vt == GGUFValueType.ARRAY else None)
    for k, (value, vtype) in keys.items():
        w.add_key_value(k, value, vtype)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(s) for s in reversed(t.shape)),
                         raw_dtype=t.tensor_type)
    for name, arr in add.items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def set_key(src: Path, dst: Path, key: str, value, vtype) -> None:
    """A copy of a GGUF with one key set (gguf-py)."""
    gguf_copy(src, dst, keys={key: (value, vtype)})


def llamacpp_logits(path: Path, ids: list[int], prompt: list[int] | None = None, n: int = 0):
    """llama.cpp's logits of ids and (prompt given) its greedy continuation of prompt."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=64, n_batch=64, logits_all=True, n_threads=2, flash_attn=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    out = []
    if prompt is not None:
        llm.reset()
        llm.eval(prompt)
        for _ in range(n):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
    del llm
    return logits, np.array(out, dtype=np.int64)


def llamacpp_goldens(out: Path, name: str, texts: list[str] | None = None) -> None:
    """A llama.cpp-checked fixture's `goldens` step: llama.cpp's logits of `ids` and greedy continuation of `prompt`
    (lc_logits, lc_greedy) on an F32 copy of out/name.gguf, added to out/name.npz; its version into out/name.json.
    texts: also tok_<i>, llama.cpp's token ids of texts[i] (Llama.tokenize(add_bos=True, special=True)), and the
    texts into the json."""
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy

    path = out / f"{name}.npz"
    arrays = dict(np.load(path))
    ids, prompt = arrays["ids"].tolist(), arrays["prompt"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{name}.gguf"
        f32_copy(out / f"{name}.gguf", f32)
        arrays["lc_logits"], arrays["lc_greedy"] = llamacpp_logits(f32, ids, prompt, len(arrays["greedy"]))
        if texts:
            llm = llama_cpp.Llama(str(f32), vocab_only=True, verbose=False)
            for i, text in enumerate(texts):
                arrays[f"tok_{i}"] = np.array(llm.tokenize(text.encode(), add_bos=True, special=True), dtype=np.int64)
            del llm
    np.savez_compressed(path, **arrays)
    meta = json.loads((out / f"{name}.json").read_text())
    if texts:
        meta["texts"] = texts
    meta["llama_cpp"] = llama_cpp.__version__
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"llama.cpp vs the torch reference: max rel err {rel_err(arrays['lc_logits'], arrays['logits']):.2e}; "
          f"greedy {arrays['lc_greedy'].tolist()} (reference's {arrays['greedy'].tolist()})")


def llamacpp_variant(out: Path, name: str, key: str, ref: str, edit, n: int | None = None) -> dict:
    """A goldens variant: llama.cpp's logits of ids[:n] on an F32 copy of out/name.gguf edited by edit(src, dst)
    (say gguf_copy with a key set or tensors added or dropped), added to out/name.npz as `key`; its max rel err
    against the torch reference's `ref` printed. Returns the arrays."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy

    path = out / f"{name}.npz"
    arrays = dict(np.load(path))
    with tempfile.TemporaryDirectory() as tmp:
        f32, edited = Path(tmp) / f"{name}.gguf", Path(tmp) / f"{name}-edited.gguf"
        f32_copy(out / f"{name}.gguf", f32)
        edit(f32, edited)
        arrays[key], _ = llamacpp_logits(edited, arrays["ids"][:n].tolist())
    np.savez_compressed(path, **arrays)
    print(f"{key} vs {ref}: max rel err {rel_err(arrays[key][:len(arrays[ref])], arrays[ref]):.2e}")
    return arrays


def goldens() -> None:
    from gguf import GGUFValueType

    llamacpp_goldens(OUT, NAME)
    llamacpp_variant(OUT, NAME, "lc_logits_skip", "logits_skip",
                     lambda src, dst: set_key(src, dst, f"{NAME}.skip_loop_final_norm", True, GGUFValueType.BOOL))


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
