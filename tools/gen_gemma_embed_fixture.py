"""Make the gemma-embedding (EmbeddingGemma) fixture: a tiny random Gemma 3 text model with bidirectional attention
(transformers' Gemma3TextModel, use_bidirectional_attention=True) and sentence-transformers' modules after it (mean
pooling, two Dense layers), converted to GGUF by llama.cpp's own converter with --sentence-transformers-dense-modules;
transformers' float32 hidden states and the sentence-transformers pipeline computed here as the reference, and
llama.cpp's own pooled embeddings and token ids as goldens. Nothing here imports minfer.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_gemma_embed_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_gemma_embed_fixture.py goldens

`build` writes, under tests/data/arch/:
  gemma-embedding.gguf  convert_hf_to_gguf.py --outtype f16 --sentence-transformers-dense-modules of the model
                        directory below (2-D weights rounded to float16 first by gen_arch_fixtures.randomize, the Dense
                        weights too, so the file holds exactly the weights transformers ran).
  gemma-embedding.npz   ids_<i> (T,), hidden_<i> (T, D) float32: transformers' last_hidden_state (after the final
                        norm) of input i; st_<i> (D,): the sentence-transformers pipeline before its Normalize module,
                        dense_3(dense_2(mean(hidden_<i>))), computed here in float64 (the Dense modules are bias-free
                        nn.Linear with the Identity activation, as EmbeddingGemma's 2_Dense / 3_Dense configs say).
                        Inputs: TEXTS encoded by the HF tokenizer, and random ids of 20 and 40 tokens.
  gemma-embedding.json  the config, the Dense dims, the seed, the transformers version, the texts.

The model directory is laid out as google/embeddinggemma-300m's: config.json (architectures Gemma3TextModel, which the
converter registers as EmbeddingGemma: conversion/gemma.py; use_bidirectional_attention true; sliding_window as
written, which the converter reads raw since transformers' config halves it: its __post_init__), modules.json,
1_Pooling/config.json (pooling_mode_mean_tokens: the converter's _try_set_pooling_type writes pooling_type 1),
2_Dense/ and 3_Dense/ (config.json in_features / out_features, model.safetensors `linear.weight`; the converter writes
dense_2.weight / dense_3.weight and gemma-embedding.dense_{2,3}_feat_{in,out}), 4_Normalize (not converted: llama.cpp
normalizes outside the graph, common_embd_normalize).

The shape: 6 layers (llama.cpp reads no pattern key for this arch: load_swa_pattern(ml, 6), layers 0-4 sliding and 5
global; transformers' layer_types agree), hidden 32, 2 heads of 16 with one kv head, FFN 64, a window of 8
(llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC: |i - j| <= 4; transformers: |i - j| < 8 // 2 + 1), rope bases 100000 (global)
and 1000 (sliding: rope.freq_base_swa), Dense 32 -> 96 -> 32. The vocab: gen_arch_fixtures' tiny byte-level BPE (the
gemma3 converter takes tokenizer.json when there is no tokenizer.model: Gemma3Model.set_vocab), pre-tokenizer hash
patched to 'gpt-2' as gen_arch_fixtures does.

`goldens` writes tests/data/embed/goldens-gemma-embed.json.gz: llama.cpp's pooled embeddings (gen_embed_goldens.embed:
Llama.embed(normalize=False) on an F32 copy, F32 KV, no flash attention) for mean / cls / last / none and the file's
own pooling ("file"), of EMBED_TEXTS, and llama.cpp's token ids (Llama.tokenize) of TOKEN_TEXTS.
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
NAME = "gemma-embedding"
SEED = 4321
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it"]
# the goldens' texts: a short one, one of ~20 tokens and one of ~40 (the window of 8 matters on the longer two)
EMBED_TEXTS = TEXTS + ["minfer runs GGUF models on the CPU and on CUDA; the architecture table lists what each "
                       "model family supports, with the known gaps of each one"]
TOKEN_TEXTS = EMBED_TEXTS + ["", "  leading and trailing spaces\tand\ttabs\nnew lines  ",
                             "<s> and </s> in text", "MiXeD CaSe Ünïcödé résumé, 東京 \U0001F600"]
CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
              head_dim=16, query_pre_attn_scalar=16, rms_norm_eps=1e-6, max_position_embeddings=512, sliding_window=8,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
              final_logit_softcapping=None, attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
              use_bidirectional_attention=True, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
DENSE = (96,)      # 2_Dense: D -> 96, 3_Dense: 96 -> D
# the converter's flag, added to the argv gen_arch_fixtures.convert builds (its main() is wrapped before it runs)
DENSE_FLAG = ("import convert_hf_to_gguf as _c\n"
              "_c_main = _c.main\n"
              "def _main_dense():\n"
              "    sys.argv.append('--sentence-transformers-dense-modules')\n"
              "    _c_main()\n"
              "_c.main = _main_dense\n")


def st_modules(d: Path, D: int, dense: list) -> None:
    """sentence-transformers' module files as google/embeddinggemma-300m has them (the docstring)."""
    import torch
    from safetensors.torch import save_file

    mods = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"), ("3_Dense", "Dense"),
            ("4_Normalize", "Normalize")]
    (d / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": p,
                                                 "type": f"sentence_transformers.models.{t}"}
                                                for i, (p, t) in enumerate(mods)], indent=1))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": D, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}))
    for name, w in zip(("2_Dense", "3_Dense"), dense):
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps({
            "in_features": int(w.shape[1]), "out_features": int(w.shape[0]), "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        save_file({"linear.weight": torch.from_numpy(w).contiguous()}, str(d / name / "model.safetensors"),
                  metadata={"format": "pt"})
    (d / "4_Normalize").mkdir()


def build(llamacpp: Path) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import VOCAB, convert, make_tokenizer, randomize

    torch.manual_seed(SEED)
    cfg = transformers.Gemma3TextConfig(vocab_size=VOCAB, **CONFIG)
    cfg._attn_implementation = "eager"
    model = transformers.Gemma3TextModel(cfg).float().eval()
    assert model.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"], model.config.layer_types
    assert model.config.sliding_window == CONFIG["sliding_window"] // 2 + 1
    randomize(model, SEED)       # RMSNorm w (y = x * (1 + w)) around 0, matrices float16-exact
    D = CONFIG["hidden_size"]
    g = torch.Generator().manual_seed(SEED + 1)
    dense = []
    for n_in, n_out in ((D, DENSE[0]), (DENSE[0], D)):
        w = torch.randn((n_out, n_in), generator=g) * (1.5 / n_in ** 0.5)
        dense.append(w.half().float().numpy())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        model.save_pretrained(d, safe_serialization=True)
        c = json.loads((d / "config.json").read_text())
        assert c["sliding_window"] == CONFIG["sliding_window"] and c["architectures"] == ["Gemma3TextModel"], c
        make_tokenizer(d)
        st_modules(d, D, dense)
        convert(d, OUT / f"{NAME}.gguf", llamacpp, extra=DENSE_FLAG)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(SEED)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    inputs += [rng.integers(3, VOCAB, size=n).tolist() for n in (20, 40)]
    arrays = {}
    for i, ids in enumerate(inputs):
        with torch.no_grad():
            h = model(torch.tensor([ids])).last_hidden_state[0].float().numpy()
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{i}"] = h
        pooled = h.astype(np.float64).mean(0)
        arrays[f"st_{i}"] = (dense[1].astype(np.float64) @ (dense[0].astype(np.float64) @ pooled)).astype(np.float32)
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": type(model).__name__, "seed": SEED, "texts": TEXTS,
        "dense": [list(w.shape) for w in dense], "config": json.loads(cfg.to_json_string())},
        indent=1, sort_keys=True) + "\n")
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, {len(inputs)} inputs "
          f"({[len(x) for x in inputs]} tokens)")


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen_embed_goldens
    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys, embed

    gen_embed_goldens.TEXTS = EMBED_TEXTS      # what embed() runs
    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False) on an "
                     "F32 copy of the fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_gemma_embed_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(OUT / f"{NAME}.gguf", f32, {}, f32=True)
        per = {}
        for pname, p in POOLINGS.items():
            per[pname] = embed(f32, p)
            assert per[pname]["pooling_type"] == p, pname
        per["file"] = embed(f32, None)
        assert per["file"]["pooling_type"] == 1, per["file"]["pooling_type"]     # 1_Pooling: mean
        out["fixtures"][NAME] = per
        llm = llama_cpp.Llama(str(OUT / f"{NAME}.gguf"), vocab_only=True, verbose=False)
        out["tokens"][NAME] = token_rows(llm, TOKEN_TEXTS)
        del llm
    dst = ROOT / "tests" / "data" / "embed" / "goldens-gemma-embed.json.gz"
    # gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under a size limit
    import gzip

    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write((json.dumps(out, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))
    print("wrote", dst, dst.stat().st_size, "bytes", file=sys.stderr)


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
