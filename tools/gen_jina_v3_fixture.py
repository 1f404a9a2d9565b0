"""Make the jina-bert-v3 fixture tests/data/arch/jina-bert-v3.{gguf,npz,json} and its llama.cpp goldens
tests/data/embed/goldens-jina-v3.json.gz: a tiny random jina-embeddings-v3 (XLM-RoBERTa with rotary positions instead of
a position table, jinaai's xlm-roberta-flash-implementation layout, with task LoRA adapters), converted to GGUF by
llama.cpp's own converter (conversion/bert.py XLMRobertaModel: `lora_adaptations` in config.json makes it write arch
`jina-bert-v3`), with transformers' JinaEmbeddingsV3Model (float32) as the hidden-state reference. Nothing here
imports minfer.

Two steps, in two environments (transformers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_jina_v3_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_jina_v3_fixture.py goldens

`build`:
  the model     transformers' JinaEmbeddingsV3Model (hidden 64, 2 layers, 4 heads of 16, ffn 96, rope_theta 20000 as
                jina-embeddings-v3's rotary_emb_base, layer_norm_eps 1e-5, hidden_act gelu), weights from
                gen_arch_fixtures.randomize (float16-exact; biases centered). transformers' port has no LoRA: it is
                the base model, which is what llama.cpp runs without an adapter.
  the checkpoint written in jinaai's original layout (what the converter reads; transformers' own
                conversion_mapping "jina_embeddings_v3" is the inverse): roberta.embeddings.word_embeddings /
                token_type_embeddings and each Linear as `<name>.parametrizations.weight.original`, roberta.emb_ln,
                encoder.layers.<i>.mixer.Wqkv (q, k, v stacked) / mixer.out_proj / norm1 / mlp.fc1 / mlp.fc2 /
                norm2, roberta.pooler.dense, plus random LoRA tensors `<name>.parametrizations.weight.0.lora_A`
                (n_tasks, r, in) and `lora_B` (n_tasks, out, r) for every Linear; config.json model_type
                xlm-roberta, architectures XLMRobertaModel, position_embedding_type rotary, rotary_emb_base,
                lora_adaptations (5 tasks, as the real model), lora_alpha, task_instructions. The vocabulary is
                tools/gen_xlmr_fixture.py's tiny SentencePiece Unigram (make_tokenizer; 202 tokens), and a
                sentence-transformers mean Pooling module (the real model's), so the file says pooling MEAN.
  jina-bert-v3.gguf  convert_hf_to_gguf.py --outtype f16. The converter (XLMRobertaModel.modify_tensors) writes the
                base weights only and splits every `.0.lora_A/B` into one LoRA GGUF per task
                (`lora-<task>-jina-bert-v3.gguf`, general.type adapter, adapter.lora.alpha, task name, prompt
                prefix); those adapter files are checked here (names, count, no lora tensor in the base file) and
                not kept.
  jina-bert-v3.npz   ids_<i> (T,), hidden_<i> (T, D): transformers' last_hidden_state as released (erf GELU) and
                hidden_tanh_<i> with GELU's tanh form (llama.cpp's ggml_gelu); inputs TEXTS as HF's tokenizer
                encodes them, then random ids of 40 and 100 tokens.
  jina-bert-v3.json  the config, the seed, the transformers version, the texts, the adapters the converter wrote.

`goldens` writes tests/data/embed/goldens-jina-v3.json.gz: llama.cpp's pooled embeddings of an F32 copy of the file
(Llama.embed normalize=False -> `embedding`, normalize=True -> `embedding_normalized`; F32 KV, no flash attention) for
mean, cls, last, none and the file's pooling, in eurobert's goldens layout ({"fixtures": {"jina-bert-v3": {pooling:
{"pooling_type", "inputs": [{"text", "ids", "embedding", "embedding_normalized"}]}}}}), and llama.cpp's token ids
(Llama.tokenize) of TOKEN_TEXTS with add_special / parse_special on and off. Floats are written with 8 significant
digits (float32 carries ~7.2; 5e-9 relative off llama.cpp's values), no indentation: the file stays under 250 KB.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "tests" / "data" / "arch"
OUT = ROOT / "tests" / "data" / "embed"
NAME = "jina-bert-v3"
SEED = 7373
RANK = 4
TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
              max_position_embeddings=130, type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu",
              pad_token_id=1, bos_token_id=0, eos_token_id=2)
ROPE_THETA = 20000.0
TEXTS = ["Hello world", "the capital of china is beijing.", "Bonjour le monde, Ça va très bien ?",
         "東京は日本の首都です。 Привет мир", "what is the capital of germany? berlin is the capital of germany."]
TOKEN_TEXTS = TEXTS + [
    "", " ", "  leading and   inner\tand\ttabs\nnew lines  ", "<s> special </s> tokens <pad> and <unk> in text",
    "a <mask> b<mask>c  <mask>  d", "MiXeD CaSe Ünïcödé résumé café naïve", "Ω Å Ａｂｃ ｃａｔ １２",
    "emoji \U0001F44D\U0001F3FD and symbols © ® ™"]


def jinaai_state_dict(model, rng) -> dict:
    """transformers' JinaEmbeddingsV3Model weights under jinaai's original names (module doc), with random LoRA."""
    import torch

    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: dict = {}

    def param(name: str, w: torch.Tensor, lora: bool = True) -> None:
        out[f"{name}.parametrizations.weight.original"] = w.contiguous()
        if lora:      # jinaai's LoRAParametrization: lora_A (tasks, r, in), lora_B (tasks, out, r)
            a = rng.standard_normal((len(TASKS), RANK, w.shape[1])).astype(np.float32) * 0.1
            b = rng.standard_normal((len(TASKS), w.shape[0], RANK)).astype(np.float32) * 0.1
            out[f"{name}.parametrizations.weight.0.lora_A"] = torch.from_numpy(a)
            out[f"{name}.parametrizations.weight.0.lora_B"] = torch.from_numpy(b)

    param("roberta.embeddings.word_embeddings", sd["embeddings.word_embeddings.weight"], lora=False)
    param("roberta.embeddings.token_type_embeddings", sd["embeddings.token_type_embeddings.weight"], lora=False)
    for s in ("weight", "bias"):
        out[f"roberta.emb_ln.{s}"] = sd[f"embeddings.LayerNorm.{s}"]
        out[f"roberta.pooler.dense.{s}"] = sd[f"pooler.dense.{s}"]
    for i in range(CONFIG["num_hidden_layers"]):
        src, dst = f"layers.{i}", f"roberta.encoder.layers.{i}"
        a = f"{src}.self_attn"
        param(f"{dst}.mixer.Wqkv", torch.cat([sd[f"{a}.{p}_proj.weight"] for p in "qkv"]))
        out[f"{dst}.mixer.Wqkv.bias"] = torch.cat([sd[f"{a}.{p}_proj.bias"] for p in "qkv"])
        param(f"{dst}.mixer.out_proj", sd[f"{a}.o_proj.weight"])
        out[f"{dst}.mixer.out_proj.bias"] = sd[f"{a}.o_proj.bias"]
        for hf, jn in (("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            param(f"{dst}.{jn}", sd[f"{src}.{hf}.weight"])
            out[f"{dst}.{jn}.bias"] = sd[f"{src}.{hf}.bias"]
        for hf, jn in (("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2")):
            for s in ("weight", "bias"):
                out[f"{dst}.{jn}.{s}"] = sd[f"{src}.{hf}.{s}"]
    return out


def jinaai_config(vocab_size: int) -> dict:
    return {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": vocab_size, **CONFIG,
            "position_embedding_type": "rotary", "rotary_emb_base": ROPE_THETA, "lora_adaptations": TASKS,
            "lora_rank": RANK, "lora_alpha": 1, "lora_dropout_p": 0.0,
            "task_instructions": {t: (f"Represent the {t} text: " if t.startswith("retrieval") else "")
                                  for t in TASKS},
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "torch_dtype": "float32"}


def sentence_transformers_files(d: Path) -> None:
    """modules.json + 1_Pooling/config.json (mean, as jina-embeddings-v3's), read into jina-bert-v3.pooling_type."""
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": CONFIG["hidden_size"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))


def build(llamacpp: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.activations import ACT2FN

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, randomize
    from gen_xlmr_fixture import VOCAB, make_tokenizer

    torch.manual_seed(SEED)
    cfg = transformers.JinaEmbeddingsV3Config(vocab_size=VOCAB + 2, **CONFIG,
                                              rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    model = transformers.JinaEmbeddingsV3Model(cfg).float().eval()
    model.config._attn_implementation = "eager"
    randomize(model, SEED, centered_bias=True)
    rng = np.random.default_rng(SEED)
    adapters = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        save_file(jinaai_state_dict(model, rng), str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(jinaai_config(VOCAB + 2), indent=1))
        make_tokenizer(d)
        sentence_transformers_files(d)
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        convert(d, out_dir / f"{NAME}.gguf", llamacpp, raw_config=True)
        (out_dir / f"{NAME}.gguf").replace(ARCH / f"{NAME}.gguf")
        sys.path.insert(0, str(llamacpp / "gguf-py"))
        from gguf import GGUFReader
        for f in sorted(out_dir.glob("lora-*.gguf")):
            r = GGUFReader(str(f))
            names = [t.name for t in r.tensors]
            assert names and all(n.endswith((".lora_a", ".lora_b")) for n in names), names
            adapters.append({"file": f.name, "general.type": r.fields["general.type"].contents(),
                             "task": r.fields["adapter.lora.task_name"].contents(), "n_tensors": len(names)})
        assert len(adapters) == len(TASKS), adapters
        base = GGUFReader(str(ARCH / f"{NAME}.gguf"))
        assert base.fields["general.architecture"].contents() == NAME
        assert not any("lora" in t.name for t in base.tensors)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == 0 and ids[-1] == 2 for ids in inputs), inputs
    inputs += [[0, *rng.integers(4, VOCAB + 2, size=n - 2).tolist(), 2] for n in (40, 100)]

    def hidden(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).last_hidden_state[0].float().numpy()

    arrays = {}
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{i}"] = hidden(ids)
    for layer in model.layers:
        layer.mlp.activation_fn = ACT2FN["gelu_pytorch_tanh"]
    for i, ids in enumerate(inputs):
        arrays[f"hidden_tanh_{i}"] = hidden(ids)
    d_tanh = max(float(np.abs(arrays[f"hidden_{i}"] - arrays[f"hidden_tanh_{i}"]).max()
                       / np.abs(arrays[f"hidden_{i}"]).max()) for i in range(len(inputs)))
    np.savez_compressed(ARCH / f"{NAME}.npz", **arrays)
    (ARCH / f"{NAME}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": type(model).__name__, "seed": SEED, "texts": TEXTS,
        "pooling": "mean (sentence-transformers 1_Pooling)", "adapters_written_by_converter": adapters,
        "config": json.loads(cfg.to_json_string()), "jinaai_config": jinaai_config(VOCAB + 2),
        "erf_vs_tanh_gelu_hidden_rel": d_tanh,
        "commands": [f"/work/tfvenv/bin/python tools/gen_jina_v3_fixture.py build --llamacpp {llamacpp}",
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_jina_v3_fixture.py goldens"]},
        indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{NAME}: {(ARCH / f'{NAME}.gguf').stat().st_size} bytes, {len(inputs)} inputs, {len(adapters)} adapters "
          f"split out, erf vs tanh GELU {d_tanh:.2e}")


def embed_both(path: Path, pooling: int | None) -> dict:
    """llama.cpp's vectors of TEXTS, normalize False and True (F32 KV, no flash attention)."""
    import llama_cpp

    kw = {} if pooling is None else {"pooling_type": pooling}
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False, **kw)
    rows = [{"text": t, "ids": [int(x) for x in llm.tokenize(t.encode("utf-8"))],
             "embedding": llm.embed(t, normalize=False), "embedding_normalized": llm.embed(t, normalize=True)}
            for t in TEXTS]
    d = {"pooling_type": int(llm.pooling_type()), "inputs": rows}
    del llm
    return d


def rounded(x):
    if isinstance(x, float):
        return float(f"{x:.8g}")
    if isinstance(x, list):
        return [rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return x


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_embed_goldens import POOLINGS, copy_with_keys

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False and "
                     "True) on an F32 copy of the fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_jina_v3_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(ARCH / f"{NAME}.gguf", f32, {}, f32=True)
        per = {}
        for pname, p in POOLINGS.items():
            per[pname] = embed_both(f32, p)
            assert per[pname]["pooling_type"] == p, pname
        per["file"] = embed_both(f32, None)
        assert per["file"]["pooling_type"] == 1, per["file"]["pooling_type"]     # MEAN, from the Pooling module
        out["fixtures"][NAME] = per
        llm = llama_cpp.Llama(str(ARCH / f"{NAME}.gguf"), vocab_only=True, verbose=False)
        rows = []
        for t in TOKEN_TEXTS:
            b = t.encode("utf-8")
            rows.append({"text": t,
                         "special": [int(x) for x in llm.tokenize(b, add_bos=True, special=False)],
                         "special_parsed": [int(x) for x in llm.tokenize(b, add_bos=True, special=True)],
                         "plain": [int(x) for x in llm.tokenize(b, add_bos=False, special=False)],
                         "plain_parsed": [int(x) for x in llm.tokenize(b, add_bos=False, special=True)]})
        out["tokens"][NAME] = rows
        del llm
    dst = OUT / "goldens-jina-v3.json.gz"
    # 8 significant digits (float32 carries ~7.2), 5e-9 relative off llama.cpp's floats; gzipped (no name, mtime 0:
    # deterministic), as the repository travels to the GPU machine under a size limit
    import gzip

    text = json.dumps(rounded(out), separators=(",", ":"), ensure_ascii=False) + "\n"
    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write(text.encode("utf-8"))
    print("wrote", dst, file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and transformers' hidden states (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's embeddings and token ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
