"""Make the minicpm fixture: a tiny random MiniCPM (MiniCPMForCausalLM: MiniCPM-1B / 2B, a remote-code model with
no class in transformers 5.25) checkpoint in the released Hugging Face layout, converted to GGUF by llama.cpp's own
converter (conversion/minicpm.py MiniCPMModel), with two references: a torch forward of the HF checkpoint written
here from the MiniCPM architecture (modeling_minicpm.py as released with openbmb/MiniCPM-2B-sft-bf16), and
llama.cpp's own logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_minicpm_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_minicpm_fixture.py goldens

`build` writes, under tests/data/arch/:
  minicpm.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight drawn float16-exact, so
                the file holds exactly the weights the reference ran.
  minicpm.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
                greedy (N,): its greedy continuation; logits_tied (16, V): the forward of ids[:16] with lm_head =
                embed_tokens; lr_short, lr_long (8,): LongRoPE factors; logits_lr, logits_lr_long (16, V): the
                forward of ids[:16] with each set (rope_scaling longrope, original_max_position_embeddings 256).
                Also the LongRoPE checkpoint's conversion, to minicpm_longrope.gguf in the temp dir (for goldens;
                checked to be minicpm.gguf plus rope.scaling.type longrope and the two factor tensors).
  minicpm.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds to minicpm.npz: lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention); lc_greedy (N,): llama.cpp's greedy continuation of prompt; lc_logits_lr / lc_logits_lr_long (16, V):
llama.cpp's logits of ids[:16] on the LongRoPE file at n_ctx 64 (the short factors) and 512 (past the trained 256:
the long ones).

The checkpoint (MiniCPM-2B's config.json, shrunk): architectures MiniCPMForCausalLM, model_type minicpm, hidden 64,
4 heads of 16, 2 kv heads (GQA, as MiniCPM-1B / MiniCPM4), FFN 96, 2 layers, vocab 320, rms_norm_eps 1e-5,
rope_theta 10000, tie_word_embeddings false (an untied head; MiniCPM-2B ties: logits_tied below is that head on the
same weights; a tied random model repeats its last token, so the greedy check runs untied), scale_emb 12 (the release's),
dim_model_base 256 (the release's: logits / (64 / 256), i.e. times 4), scale_depth 0.6 (the release has 1.4; with
2 layers 1.4 / sqrt(2) = 0.99 would make the residual scale indistinguishable from 1, 0.6 / sqrt(2) = 0.42 is not).
Names: model.embed_tokens, model.layers.N.input_layernorm / post_attention_layernorm,
model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj, model.norm, lm_head.
Tokenizer: a SentencePiece BPE with byte fallback (the converter's MiniCPMModel.set_vocab is
_set_vocab_sentencepiece): unk 0, <s> 1, </s> 2, the 256 byte pieces, then merges.

The reference forward (reference() below), as modeling_minicpm.py computes it:
    x = embed_tokens(ids) * scale_emb
    per layer: x = x + attn(rmsnorm(x)) * (scale_depth / sqrt(L)); x = x + mlp(rmsnorm(x)) * (scale_depth / sqrt(L))
    attn: rotate_half rope on the HF rows, GQA (kv head g serves query heads g*2, g*2+1), softmax(q k / sqrt(Dh))
    mlp: down(silu(gate h) * up h)
    logits = lm_head(rmsnorm(x) / (hidden_size / dim_model_base))        (lm_head, or embed_tokens when tied)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, cli, greedy, rel_err, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "minicpm"
SEED = 2025
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 64, 4, 2, 16, 96, 2
THETA, EPS = 10000.0, 1e-5
SCALE_EMB, SCALE_DEPTH, DIM_BASE = 12.0, 0.6, 256
SEQ, PROMPT, NEW = 40, 8, 16
SHORT_SEQ = 16     # the tied and LongRoPE references: the first 16 ids only (each fixture file < 250 KB)
# LongRoPE (MiniCPM4 / MiniCPM-2B-128k's rope_scaling): head_dim/2 divisors each, original length = max positions
LR_SHORT = [1.0, 1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0]
LR_LONG = [1.0, 1.5, 2.5, 4.0, 8.0, 16.0, 32.0, 48.0]
LR_GGUF = Path(tempfile.gettempdir()) / "minicpm_longrope.gguf"     # build -> goldens (not kept in the repo)


def hf_config(longrope: bool = False) -> dict:
    rope = {"rope_type": "longrope", "short_factor": LR_SHORT, "long_factor": LR_LONG,
            "original_max_position_embeddings": 256} if longrope else None
    return {"architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "hidden_act": "silu", "max_position_embeddings": 256,
            "initializer_range": 0.1, "rms_norm_eps": EPS, "use_cache": True, "bos_token_id": 1,
            "eos_token_id": 2, "tie_word_embeddings": False, "rope_theta": THETA, "rope_scaling": rope,
            "scale_emb": SCALE_EMB, "dim_model_base": DIM_BASE, "scale_depth": SCALE_DEPTH,
            "torch_dtype": "float16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), the embedding ~ N(0, 0.3^2) (times
    scale_emb 12 in the forward), norm weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (0.3 * torch.randn(VOCAB, D, generator=g)).half().float()}
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


def reference(t: dict, ids: list[int], tied: bool = False, factors: list | None = None) -> np.ndarray:
    """MiniCPM's forward on the HF tensors, float64 -> (T, V) float32 logits (tied: lm_head = embed_tokens, as
    MiniCPM-2B's tie_word_embeddings true; factors: LongRoPE's divisors of each frequency, MiniCPMLongRoPE's
    freqs = outer(t, 1 / ext_factors) * inv_freq, its cos/sin factor sqrt(1 + ln(256 / 256) / ln(256)) = 1)."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    res = SCALE_DEPTH / LAYERS ** 0.5

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    if factors is not None:
        inv = inv / torch.tensor(factors, dtype=torch.float64)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)          # (T, Dh): HF's emb = cat(freqs, freqs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]            # (T, 1, Dh)

    def rope(x):                                                  # rotate_half: the two halves of each head
        x1, x2 = x[..., :DH // 2], x[..., DH // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    emb = w["model.embed_tokens.weight"]
    x = emb[torch.tensor(ids)] * SCALE_EMB
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, DH))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, DH)
        o = causal_attention(q, k, v)                             # HF repeat_kv: kv head g -> heads 2g, 2g+1
        x = x + (o @ w[p + "self_attn.o_proj.weight"].T) * res
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"]) * res
    x = rms(x, w["model.norm.weight"]) / (D / DIM_BASE)
    return (x @ (emb if tied else w["lm_head.weight"]).T).float().numpy()


def make_spm_tokenizer(path: Path) -> None:
    """A SentencePiece BPE of VOCAB pieces with byte fallback (unk 0, <s> 1, </s> 2, <0x00>..<0xFF>, then merges
    trained on the README folded to lower-case letters, digits and spaces)."""
    import io
    import re

    import sentencepiece as spm

    text = re.sub(r"[^a-z0-9 ]+", " ", (ROOT / "README.md").read_text(encoding="utf-8").lower())
    lines = [ln.strip() for ln in re.split(r" {2,}", text) if len(ln.strip()) > 3]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=VOCAB,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (path / "tokenizer.model").write_bytes(buf.getvalue())


def build(llamacpp: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert

    t = weights(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        (d / "config.json").write_text(json.dumps(hf_config(), indent=1))
        (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
        save_file({k: v.half().contiguous() for k, v in t.items()}, d / "model.safetensors", metadata={"format": "pt"})
        make_spm_tokenizer(d)
        # raw_config: the converter reads config.json as written (transformers knows no minicpm without remote code)
        convert(d, OUT / f"{NAME}.gguf", llamacpp, raw_config=True)
        # the LongRoPE variant: the same checkpoint with rope_scaling longrope, converted to LR_GGUF for `goldens`
        (d / "config.json").write_text(json.dumps(hf_config(longrope=True), indent=1))
        convert(d, LR_GGUF, llamacpp, raw_config=True)
    check_longrope_file(llamacpp)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    prompt = ids[:PROMPT]
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = np.array(greedy(lambda x: reference(t, x), prompt, NEW), dtype=np.int64)
    short = ids[:SHORT_SEQ]
    arrays["logits_tied"] = reference(t, short, tied=True)
    arrays["lr_short"], arrays["lr_long"] = np.array(LR_SHORT, np.float32), np.array(LR_LONG, np.float32)
    arrays["logits_lr"] = reference(t, short, factors=LR_SHORT)         # HF: seq 16 <= 256, the short factors
    arrays["logits_lr_long"] = reference(t, short, factors=LR_LONG)     # what a context past 256 takes
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                                                  "tokenizer_config": tokenizer_config()}, indent=1) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def check_longrope_file(llamacpp: Path) -> None:
    """The converter's LongRoPE file is the plain one plus rope.scaling.type longrope and the two factor tensors
    (MiniCPMModel.generate_extra_tensors, TextModel.set_gguf_parameters): what tests/models/test_minicpm.py
    rebuilds from minicpm.gguf with lr_short / lr_long."""
    sys.path.insert(0, str(llamacpp / "gguf-py"))
    from gguf import GGUFReader

    a, b = GGUFReader(str(OUT / f"{NAME}.gguf")), GGUFReader(str(LR_GGUF))
    ka, kb = set(a.fields), set(b.fields)
    assert kb - ka == {"minicpm.rope.scaling.type"} and not ka - kb, (kb - ka, ka - kb)
    assert b.fields["minicpm.rope.scaling.type"].contents() == "longrope"
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert set(tb) - set(ta) == {"rope_factors_long.weight", "rope_factors_short.weight"} and set(ta) <= set(tb)
    assert all(np.array_equal(ta[n].data, tb[n].data) for n in ta)
    assert np.array_equal(np.asarray(tb["rope_factors_short.weight"].data), np.array(LR_SHORT, np.float32))
    assert np.array_equal(np.asarray(tb["rope_factors_long.weight"].data), np.array(LR_LONG, np.float32))


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)
    path = OUT / f"{NAME}.npz"
    arrays = dict(np.load(path))
    ids = arrays["ids"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        # LongRoPE: a context within the trained 256 takes the short factors, one past it the long ones
        f32 = Path(tmp) / f"{NAME}.gguf"
        f32_copy(LR_GGUF, f32)
        for key, n_ctx in (("lc_logits_lr", 64), ("lc_logits_lr_long", 512)):
            llm = llama_cpp.Llama(str(f32), n_ctx=n_ctx, n_batch=64, logits_all=True, n_threads=2,
                                  flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                                  verbose=False)
            n = len(arrays["logits_lr"])
            llm.eval(ids[:n])
            arrays[key] = np.array(llm.scores[:n], dtype=np.float32)
            del llm
    np.savez_compressed(path, **arrays)
    for k in ("lr", "lr_long"):
        e = rel_err(arrays[f"lc_logits_{k}"], arrays[f"logits_{k}"])
        print(f"LongRoPE {k}: llama.cpp vs the reference {e:.2e}")


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece")
