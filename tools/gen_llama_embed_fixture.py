"""Make the llama-embed fixture tests/data/arch/llama-embed.{gguf,npz,json} and its llama.cpp goldens
tests/data/embed/goldens-llama-embed.json.gz: a tiny random llama checkpoint saved as HF "LlamaBidirectionalModel"
(nvidia/llama-embed-nemotron-8b's architecture: Llama with attention over the whole input, embeddings only), converted
to GGUF by llama.cpp's own converter (conversion/llama.py LlamaEmbedNemotronModel, a LlamaModel: q/k rows permuted
for NORM rope), with transformers' float32 hidden states as the reference.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_llama_embed_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_llama_embed_fixture.py goldens

Nothing here imports minfer (the helpers come from tools/gen_arch_fixtures.py, gen_bert_fixture.py,
gen_embed_goldens.py, gen_eurobert_fixture.py).

`build` writes:
  llama-embed.gguf  convert_hf_to_gguf.py --outtype f16 of the random model (config.json: architectures
                    ["LlamaBidirectionalModel"], model_type llama, is_causal false), every weight rounded to float16
                    first (gen_arch_fixtures.randomize). 2 layers, hidden 64, 4 heads of 16 with 2 kv heads (GQA), ffn
                    96, rms_norm_eps 1e-5, llama3 rope scaling (rope_theta 500000, factor 8, original context 64, so
                    the converter writes rope_freqs.weight and it matters at these head sizes: llama-embed-nemotron-8b
                    is a Llama-3.1-8B). is_causal false makes the converter write llama-embed.attention.causal false
                    (conversion/base.py TextModel.set_gguf_parameters); LlamaModel does not call
                    _try_set_pooling_type, so the file has no pooling_type whatever modules.json says (none here).
                    A byte-level BPE of 320 tokens (gen_arch_fixtures.make_tokenizer) wrapped <s> ... </s> by its
                    post-processor (gen_eurobert_fixture.tokenizer).
  llama-embed.npz   ids_<i> (T,), hidden_<i> (T, D) float32: transformers LlamaModel's last_hidden_state with
                    is_causal False (checked equal to a run with an explicit all-zeros 4-D float mask), and
                    causal_<i>: the same model with causal attention, of input i: TEXTS by the HF tokenizer, then
                    random ids of 40 and 100 tokens.
  llama-embed.json  the config, the seed, the transformers version, the texts.

`goldens` writes tests/data/embed/goldens-llama-embed.json.gz: llama.cpp's pooled embeddings (an F32 copy, F32 KV, no
flash attention: gen_embed_goldens.embed) for mean, cls, last, none and the file's (no pooling_type: NONE),
normalized and not; `absent_causal_key`: llama.cpp's per-token rows (pooling none) of a copy without
llama-embed.attention.causal (hparams.causal_attn then defaults to true); and Llama.tokenize's ids of TOKEN_TEXTS.
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
NAME = "llama-embed"
SEED = 7531
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_eurobert_fixture import TEXTS, TOKEN_TEXTS, embed_both, tokenizer  # noqa: E402

CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64},
              tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def hidden(model, ids: list[int], causal: bool) -> np.ndarray:
    import torch

    model.config.is_causal = causal
    for layer in model.layers:
        layer.self_attn.is_causal = causal
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].float().numpy()


def hidden_zero_mask(model, ids: list[int]) -> np.ndarray:
    """The bidirectional run another way: an explicit 4-D float mask of zeros (every key visible)."""
    import torch

    T = len(ids)
    with torch.no_grad():
        return model(torch.tensor([ids]), attention_mask=torch.zeros(1, 1, T, T)).last_hidden_state[0].float().numpy()


def build(llamacpp: Path) -> None:
    import torch
    import transformers

    from gen_arch_fixtures import VOCAB, convert, randomize

    torch.manual_seed(SEED)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, **CONFIG)
    model = transformers.LlamaModel(cfg).float().eval()
    model.config._attn_implementation = "eager"
    randomize(model, SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        model.save_pretrained(d, safe_serialization=True)
        c = json.loads((d / "config.json").read_text())
        c["architectures"] = ["LlamaBidirectionalModel"]
        c["is_causal"] = False
        (d / "config.json").write_text(json.dumps(c, indent=1))
        tokenizer(d)
        convert(d, OUT / f"{NAME}.gguf", llamacpp)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(SEED)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == 1 and ids[-1] == 2 for ids in inputs), inputs
    inputs += [[1, *rng.integers(5, VOCAB, size=n - 2).tolist(), 2] for n in (40, 100)]
    arrays = {}
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"causal_{i}"] = hidden(model, ids, True)
        arrays[f"hidden_{i}"] = hidden(model, ids, False)
        z = hidden_zero_mask(model, ids)
        assert np.abs(z - arrays[f"hidden_{i}"]).max() < 1e-6, "is_causal=False is not the all-zeros mask"
        assert np.abs(arrays[f"causal_{i}"][0] - arrays[f"hidden_{i}"][0]).max() > 1e-3
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": "LlamaModel (saved as LlamaBidirectionalModel)",
        "seed": SEED, "texts": TEXTS, "pooling": "none in the file (the converter writes no pooling_type)",
        "config": c}, indent=1, sort_keys=True) + "\n")
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, {len(inputs)} inputs")


def goldens() -> None:
    import llama_cpp

    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys, embed

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False and "
                     "True) on an F32 copy of the fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_llama_embed_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(OUT / f"{NAME}.gguf", f32, {}, f32=True)
        per = {}
        for pname, p in POOLINGS.items():
            per[pname] = embed_both(f32, p)
            assert per[pname]["pooling_type"] == p, pname
        per["file"] = embed_both(f32, None)
        assert per["file"]["pooling_type"] == 0, per["file"]["pooling_type"]     # no pooling_type key: NONE
        # the same file without llama-embed.attention.causal: hparams.causal_attn keeps its default, true
        nokey = Path(tmp) / f"{NAME}-nokey.gguf"
        from gguf import GGUFReader

        r = GGUFReader(str(f32))
        assert r.fields[f"{NAME}.attention.causal"].contents() is False
        _copy_without(f32, nokey, f"{NAME}.attention.causal")
        per["absent_causal_key"] = embed(nokey, 0)
        out["fixtures"][NAME] = per
        llm = llama_cpp.Llama(str(OUT / f"{NAME}.gguf"), vocab_only=True, verbose=False)
        out["tokens"][NAME] = token_rows(llm, TOKEN_TEXTS)
        del llm
    dst = ROOT / "tests" / "data" / "embed" / "goldens-llama-embed.json.gz"
    out = _rounded(out)     # 7 significant digits (a relative 5e-7 at most: the tests allow 1e-5), under 250 KB
    # gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under a size limit
    import gzip

    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write((json.dumps(out, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))
    print("wrote", dst, file=sys.stderr)


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def _copy_without(src: Path, dst: Path, drop: str) -> None:
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", drop):
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=[int(d) for d in reversed(t.shape)], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
