"""Make the t5encoder fixtures tests/data/arch/t5encoder{,-relu}.{gguf,npz,json} and their llama.cpp goldens
tests/data/embed/goldens-t5encoder.json.gz: tiny random transformers T5EncoderModel's (the encoder half of T5 as
llama.cpp's `t5encoder` arch: T5EncoderModel / sentence-t5 / flan-t5 and t5-v1.1 encoders), converted to GGUF by
llama.cpp's own converter, with transformers' float32 hidden states as the reference.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_t5encoder_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_t5encoder_fixture.py goldens

Nothing here imports minfer (the helpers come from tools/gen_arch_fixtures.py, gen_bert_fixture.py,
gen_embed_goldens.py).

`build` writes, for each of two models:
  t5encoder       feed_forward_proj "gated-gelu" (t5-v1.1 / flan-t5: DenseReluDense.wi_0 / wi_1 -> ffn_gate / ffn_up,
                  gelu_new = GELU's tanh form), 2 layers, d_model 32, 4 heads of d_kv 8, d_ff 64, 16 relative
                  attention buckets (8 a direction, 4 exact: the log-spaced buckets from distance 4 and the clamp
                  at max_distance 128 both reached by the 140-token input), layer_norm_epsilon 1e-6.
  t5encoder-relu  feed_forward_proj "relu" (the original T5: DenseReluDense.wi -> ffn_up, no gate), 3 layers,
                  d_kv 12 (so n_head * d_kv = 48 != d_model 32: T5's q / k / v are (H * d_kv, D)), 32 buckets.
  Both: convert_hf_to_gguf.py --outtype f16 (conversion/t5.py T5EncoderModel) of the random model, every weight
  rounded to float16 first (gen_arch_fixtures.randomize, q and k then scaled down so T5's unscaled scores stay
  around 1), so the file holds exactly the weights transformers ran; the relative_attention_bias (layer 0 only, as
  HF's T5Stack builds it) scaled up so it matters. The tokenizer: a SentencePiece Unigram model of 256 pieces
  (spiece.model, pad 0 / eos 1 / unk 2, no BOS, as T5's; identity normalization so the file carries no
  precompiled charsmap) with transformers' T5Tokenizer files (extra_ids 0): the converter writes
  tokenizer.ggml.model "t5".
  <name>.npz   ids_<i> (T,), hidden_<i> (T, D) float32: transformers' last_hidden_state (after the final
               layer norm, the row llama.cpp's graph hands to pooling) of input i: TEXTS encoded by sentencepiece
               itself (SentencePieceProcessor.encode, then </s>: T5's ids; transformers 5.25's T5Tokenizer rebuilt
               from this identity-normalized model gives <unk> for whole words, so it is not used), then random ids
               of 40 and 140 tokens. Also `buckets_rel` (-300..300) and `buckets_<n>` for n = the fixture's bucket
               count and 32: transformers' T5Attention._relative_position_bucket (bidirectional, max_distance 128) of
               each relative position (memory - query); and `rel_b_1` (the gated fixture): a random per-layer bias
               table for layer 1, which the goldens' per-layer copy adds as enc.blk.1.attn_rel_b.weight.
  <name>.json  the config, the seed, the transformers version, the texts.

`goldens` writes tests/data/embed/goldens-t5encoder.json.gz (floats as their shortest float32 decimals), per fixture:
  mean / cls / last / none: llama.cpp's own embeddings of gen_embed_goldens.TEXTS (Llama.embed, normalize False and
      True, on an F32 copy of the file, F32 KV, no flash attention, as gen_embed_goldens.embed) with attention_type
      NON_CAUSAL (llama-embedding's --attention non-causal). Needed: the converter writes no attention.causal for T5,
      so llama.cpp's default context keeps causal_attn true, and llama_decode (which Llama.embed and llama-embedding
      call) runs the encoder graph with a KV cache (create_memory makes one for T5ENCODER) and a CAUSAL mask;
      llama_encode, the encoder API, never masks (llama_context::encode). The files name no pooling either.
  none-encode: llama_encode's own rows of the second text on a default context (the encoder API), which equal the
      non-causal ones.
  none-default-decode: the default context's (causal) rows of the second text, to show the gap.
  and llama.cpp's token ids of TOKEN_TEXTS (gen_bert_fixture.token_rows); under "t5encoder-rel-b-1", the non-causal
  none rows of a copy of t5encoder with `enc.blk.1.attn_rel_b.weight` = rel_b_1 added (llama.cpp's graph uses a
  layer's own table where it has one, else layer 0's).
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
VOCAB = 256
SEED = 5151
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it",
         "Adding an architecture: a model file, a fixture, and tests against transformers and llama.cpp."]
TOKEN_TEXTS = TEXTS + ["", "  leading and trailing spaces\tand\ttabs\nnew lines  ", "special </s> and <pad> in text",
                       "MiXeD CaSe résumé", "numbers 3.14159 1,000,000", "café"]
COMMON = dict(vocab_size=VOCAB, d_model=32, num_heads=4, d_ff=64, relative_attention_max_distance=128,
              layer_norm_epsilon=1e-6, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
MODELS = {"t5encoder": dict(COMMON, num_layers=2, d_kv=8, relative_attention_num_buckets=16,
                            feed_forward_proj="gated-gelu"),
          "t5encoder-relu": dict(COMMON, num_layers=3, d_kv=12, relative_attention_num_buckets=32,
                                 feed_forward_proj="relu")}
LONG = (40, 140)        # random inputs' lengths: 140 reaches the clamp at max_distance 128


def spm_model(d: Path) -> None:
    """A SentencePiece Unigram of VOCAB pieces, T5's special ids (pad 0, eos 1, unk 2, no bos), written as
    spiece.model, plus transformers' T5Tokenizer files for it (extra_ids 0: no sentinel tokens)."""
    import io

    import sentencepiece as spm
    from transformers import T5Tokenizer

    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") + "\n") * 2
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=buf, vocab_size=VOCAB,
                                   model_type="unigram", normalization_rule_name="identity", byte_fallback=False,
                                   character_coverage=0.98, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   minloglevel=2)
    (d / "spiece.model").write_bytes(buf.getvalue())
    tok = T5Tokenizer(vocab_file=str(d / "spiece.model"), extra_ids=0)
    tok.save_pretrained(d)


def randomize_t5(model, seed: int) -> None:
    """gen_arch_fixtures.randomize, then q and k scaled by 0.35 (T5 folds 1/sqrt(d_kv) into its weights: the scores
    are not scaled, so randomize's matrices would give one-hot softmaxes) and the relative bias by 2 (so the bias
    moves the scores); all float16-exact again."""
    import torch

    from gen_arch_fixtures import randomize

    randomize(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("SelfAttention.q.weight") or name.endswith("SelfAttention.k.weight"):
                p.mul_(0.35)
            if name.endswith("relative_attention_bias.weight"):
                p.mul_(2.0)
            p.copy_(p.half().float())


def buckets(n_buckets: int):
    from transformers.models.t5.modeling_t5 import T5Attention
    import torch

    rp = torch.arange(-300, 301)
    return T5Attention._relative_position_bucket(rp, bidirectional=True, num_buckets=n_buckets,
                                                 max_distance=128).numpy().astype(np.int16)


def build(llamacpp: Path) -> None:
    import sentencepiece as spm
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert
    from gen_bert_fixture import hidden

    for k, (name, conf) in enumerate(MODELS.items()):
        torch.manual_seed(SEED + k)
        cfg = transformers.T5Config(**conf)
        model = transformers.T5EncoderModel(cfg).float().eval()
        model.config._attn_implementation = "eager"
        randomize_t5(model, SEED + k)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / name
            model.save_pretrained(d, safe_serialization=True)
            spm_model(d)
            convert(d, OUT / f"{name}.gguf", llamacpp)
            sp = spm.SentencePieceProcessor(model_file=str(d / "spiece.model"))
        rng = np.random.default_rng(SEED + k)
        inputs = [sp.encode(t) + [1] for t in TEXTS]      # T5's ids: the pieces, then </s>
        assert all(ids[-1] == 1 for ids in inputs), inputs
        inputs += [[*rng.integers(3, VOCAB, size=n - 1).tolist(), 1] for n in LONG]
        nb = conf["relative_attention_num_buckets"]
        arrays = {"buckets_rel": np.arange(-300, 301, dtype=np.int16), f"buckets_{nb}": buckets(nb),
                  "buckets_32": buckets(32)}
        for i, ids in enumerate(inputs):
            arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
            arrays[f"hidden_{i}"] = hidden(model, ids)
        if name == "t5encoder":
            g = np.random.default_rng(SEED + 100)
            arrays["rel_b_1"] = (3.0 * g.standard_normal((nb, conf["num_heads"]))).astype(np.float16).astype(
                np.float32)
        np.savez_compressed(OUT / f"{name}.npz", **arrays)
        (OUT / f"{name}.json").write_text(json.dumps({
            "transformers": transformers.__version__, "class": type(model).__name__, "seed": SEED + k,
            "texts": TEXTS, "long_inputs": list(LONG), "config": json.loads(cfg.to_json_string())},
            indent=1, sort_keys=True) + "\n")
        print(f"{name}: {(OUT / f'{name}.gguf').stat().st_size} bytes, {len(inputs)} inputs")


def llama(path: Path, pooling: int, causal: bool = False):
    """llama_cpp.Llama as gen_embed_goldens.embed opens it (F32 KV, no flash attention), with attention_type
    NON_CAUSAL (llama-embedding's --attention non-causal) unless causal (the default: UNSPECIFIED, then the file's
    causal_attn, true without the key)."""
    import llama_cpp

    att = llama_cpp.LLAMA_ATTENTION_TYPE_UNSPECIFIED if causal else llama_cpp.LLAMA_ATTENTION_TYPE_NON_CAUSAL
    return llama_cpp.Llama(str(path), embedding=True, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                           type_k=0, type_v=0, flash_attn=False, verbose=False, pooling_type=pooling,
                           attention_type=att)


def embed_both(path: Path, pooling: int, causal: bool = False, short: bool = False) -> dict:
    """Llama.embed(normalize=False and True) of gen_embed_goldens.TEXTS with the ids Llama.tokenize gives them;
    short: the second text only, not normalized (the checks that need one input)."""
    from gen_embed_goldens import TEXTS as ETEXTS

    llm = llama(path, pooling, causal)
    out = []
    for text in ETEXTS[1:] if short else ETEXTS:
        ids = [int(t) for t in llm.tokenize(text.encode("utf-8"))]
        out.append({"text": text, "ids": ids, "embedding": llm.embed(text, normalize=False)})
        if not short:
            out[-1]["embedding_normalized"] = llm.embed(text, normalize=True)
    return {"pooling_type": int(llm.pooling_type()), "causal": causal, "inputs": out}


def encode_rows(path: Path, text: str) -> dict:
    """llama_encode itself (the encoder API: llama_context::encode sets causal_attn false for an encoder graph) on
    a default context: every token's row (pooling NONE, llama_get_embeddings_ith)."""
    import llama_cpp

    llm = llama(path, 0, causal=True)
    ids = [int(t) for t in llm.tokenize(text.encode("utf-8"))]
    llm._batch.reset()
    llm._batch.set_batch(ids, n_past=0, logits_all=True)
    assert llama_cpp.llama_encode(llm._ctx.ctx, llm._batch.batch) == 0
    n = llm.n_embd()
    rows = [[float(x) for x in llama_cpp.llama_get_embeddings_ith(llm._ctx.ctx, i)[:n]] for i in range(len(ids))]
    return {"text": text, "ids": ids, "embedding": rows}


def shortest(x):
    """Every float as the shortest decimal that reads back as the same float32 (llama.cpp's values are float32s):
    the same numbers in half the text."""
    if isinstance(x, float):
        return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
    if isinstance(x, list):
        return [shortest(v) for v in x]
    if isinstance(x, dict):
        return {k: shortest(v) for k, v in x.items()}
    return x


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys, write_json_gz
    from gen_nanbeige_fixture import gguf_copy

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False and "
                     "True) on an F32 copy of each fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_t5encoder_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            f32 = Path(tmp) / f"{name}.gguf"
            copy_with_keys(OUT / f"{name}.gguf", f32, {}, f32=True)
            per = {}
            for pname, p in POOLINGS.items():
                per[pname] = embed_both(f32, p)
                assert per[pname]["pooling_type"] == p, pname
            # llama.cpp's default context (no attention_type, the file has no attention.causal): llama_decode with
            # a KV cache (create_memory makes one for T5ENCODER) runs the encoder graph CAUSALLY
            per["none-default-decode"] = embed_both(f32, POOLINGS["none"], causal=True, short=True)
            per["none-encode"] = encode_rows(f32, TEXTS[1])
            out["fixtures"][name] = per
            llm = llama_cpp.Llama(str(OUT / f"{name}.gguf"), vocab_only=True, verbose=False)
            out["tokens"][name] = token_rows(llm, TOKEN_TEXTS)
            del llm
        rel_b = np.load(OUT / "t5encoder.npz")["rel_b_1"]
        per_layer = Path(tmp) / "t5encoder-rel-b-1.gguf"
        gguf_copy(Path(tmp) / "t5encoder.gguf", per_layer, add={"enc.blk.1.attn_rel_b.weight": rel_b})
        out["fixtures"]["t5encoder-rel-b-1"] = {"none": embed_both(per_layer, POOLINGS["none"], short=True)}
    # gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under a size limit
    write_json_gz(ROOT / "tests" / "data" / "embed" / "goldens-t5encoder.json.gz", shortest(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and transformers' hidden states (needs transformers)")
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
