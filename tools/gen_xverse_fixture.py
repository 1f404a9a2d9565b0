"""Make the xverse fixture: a tiny random XVERSE (XverseForCausalLM, a remote-code model with no class in transformers
5.25) checkpoint in the released Hugging Face layout, converted to GGUF by llama.cpp's own converter
(conversion/xverse.py XverseModel), with two references: a torch forward of the HF checkpoint written here from the
XVERSE architecture (modeling_xverse.py: Llama's layer with rotate_half rope, GQA, no biases), and llama.cpp's own
logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + transformers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_xverse_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_xverse_fixture.py goldens

`build` writes, under tests/data/arch/:
  xverse.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight drawn float16-exact, so the
               file holds exactly the weights the reference ran.
  xverse.npz   ids (T,), logits (T, V) float32: the torch forward below (computed in float64) at every position;
               prompt (P,), greedy (N,): its greedy continuation.
  xverse.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds to xverse.npz: lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention); lc_greedy (N,): llama.cpp's greedy continuation of prompt; tok_<i>: llama.cpp's token ids of TEXTS[i]
(Llama.tokenize(add_bos=True, special=True)); and texts to xverse.json.

The checkpoint (xverse/XVERSE-7B's layout, shrunk):
- config.json: architectures XverseForCausalLM, model_type xverse, hidden 32, 4 heads of 8 with 2 kv heads (GQA;
  4 == 2 ** 2: the converter's k permutation is right only without GQA or where n_head == n_kv_head ** 2, as
  conversion/xverse.py _reverse_hf_permute divides the head count by the kv head count), FFN 64, 3 layers, vocab
  304, rms_norm_eps 1e-6, rope_theta 50000 (written as rope.freq_base: TextModel.set_gguf_parameters; not the default,
  so reading it is tested), tie_word_embeddings false.
- model.safetensors, the release's names: model.embed_tokens, model.layers.N.input_layernorm /
  post_attention_layernorm, model.layers.N.self_attn.q_proj / k_proj / v_proj / o_proj (no biases),
  model.layers.N.mlp.gate_proj / up_proj / down_proj, model.norm, lm_head. The converter permutes q_proj / k_proj
  to llama.cpp's NORM rope order.
- tokenizer.json (XverseModel.set_vocab asserts it and reads it through AutoTokenizer): a SentencePiece BPE with byte
  fallback (make_spm_tokenizer: unk 0, <s> 1, </s> 2, <0x00>..) turned into a tokenizers BPE by transformers'
  LlamaTokenizer; the converter writes tokenizer.ggml.model llama with its tokens and types and no scores.
  tokenizer_config.json add_bos_token true (gguf.SpecialVocab).

The reference forward (reference() below) is the architecture as modeling_xverse.py computes it, on the HF tensors:
RMSNorm, q/k/v projections, rotate_half rope on the HF rows (base rope_theta), kv heads shared by H / Hkv consecutive
query heads (repeat_kv), causal softmax(q k / sqrt(Dh)), o_proj, down(silu(gate x) * up x), final norm, lm_head.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "xverse"
SEED = 2026
VOCAB, D, H, HKV, DH, FFN, LAYERS = 304, 32, 4, 2, 8, 64, 3
THETA, EPS = 50000.0, 1e-6
SEQ, PROMPT, NEW = 24, 6, 10
TEXTS = ["The model file and the tokenizer.", " leading space and  two"]


def hf_config() -> dict:
    return {"architectures": ["XverseForCausalLM"], "model_type": "xverse", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": HKV, "hidden_act": "silu", "max_position_embeddings": 8192,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "rope_theta": THETA, "use_cache": True,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
        t[p + "self_attn.k_proj.weight"] = mat(HKV * DH, D)
        t[p + "self_attn.v_proj.weight"] = mat(HKV * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """XVERSE's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * wt

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)          # (T, Dh): HF's emb = cat(freqs, freqs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]            # (T, 1, Dh)

    def rope(x):                                                  # rotate_half: the two halves of each head
        x1, x2 = x[..., :DH // 2], x[..., DH // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, HKV, DH))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, HKV, DH)
        k, v = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)   # repeat_kv: kv head j -> H/HKV
        s = torch.einsum("thd,shd->hts", q, k) / DH ** 0.5 + mask
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * DH)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        f = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + f @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    return (x @ w["lm_head.weight"].T).float().numpy()


def greedy(t: dict, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference(t, ids)[-1].argmax()))
    return ids[len(prompt):]


def make_tokenizer_json(d: Path) -> None:
    """tokenizer.json (+ transformers' tokenizer_config.json, replaced afterwards) from a SentencePiece model of
    VOCAB pieces: transformers' LlamaTokenizer reads tokenizer.model and saves the tokenizers-library BPE."""
    from transformers import LlamaTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        make_spm_tokenizer(Path(tmp), VOCAB)
        tok = LlamaTokenizer.from_pretrained(tmp)
        tok.save_pretrained(str(d))
    if not (d / "tokenizer.json").is_file() or len(json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]) \
            != VOCAB:
        raise SystemExit("tokenizer.json was not written with the expected vocabulary")


def build(llamacpp: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert

    t = weights(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        make_tokenizer_json(d)
        (d / "config.json").write_text(json.dumps(hf_config(), indent=1))
        (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
        save_file({k: v.half().contiguous() for k, v in t.items()}, d / "model.safetensors", metadata={"format": "pt"})
        # raw_config: the converter reads config.json as written (AutoConfig knows no xverse without remote code)
        convert(d, OUT / f"{NAME}.gguf", llamacpp, raw_config=True)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    prompt = ids[:PROMPT]
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = np.array(greedy(t, prompt, NEW), dtype=np.int64)
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                                                  "tokenizer_config": tokenizer_config()}, indent=1) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy

    path = OUT / f"{NAME}.npz"
    arrays = dict(np.load(path))
    ids, prompt = arrays["ids"].tolist(), arrays["prompt"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        f32_copy(OUT / f"{NAME}.gguf", f32)
        llm = llama_cpp.Llama(str(f32), n_ctx=64, n_batch=64, logits_all=True, n_threads=2, flash_attn=False,
                              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
        llm.eval(ids)
        arrays["lc_logits"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
        llm.reset()
        llm.eval(prompt)
        out = []
        for _ in range(len(arrays["greedy"])):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
        arrays["lc_greedy"] = np.array(out, dtype=np.int64)
        for i, text in enumerate(TEXTS):
            arrays[f"tok_{i}"] = np.array(llm.tokenize(text.encode(), add_bos=True, special=True), dtype=np.int64)
        del llm
    np.savez_compressed(path, **arrays)
    meta = json.loads((OUT / f"{NAME}.json").read_text())
    meta["texts"] = TEXTS
    meta["llama_cpp"] = llama_cpp.__version__
    (OUT / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    err = float((np.abs(arrays["lc_logits"] - arrays["logits"]).max(-1) / np.abs(arrays["logits"]).max(-1)).max())
    print(f"llama.cpp vs the torch reference: max rel err {err:.2e}; greedy {arrays['lc_greedy'].tolist()} "
          f"(reference's {arrays['greedy'].tolist()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and the torch reference (needs torch, transformers, sentencepiece)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's logits, greedy ids and token ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
