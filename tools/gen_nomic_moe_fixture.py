"""Make the nomic-bert-moe fixture tests/data/arch/nomic-bert-moe.{gguf,npz,json} and its llama.cpp goldens
tests/data/embed/goldens-nomic-moe.json.gz: a tiny random checkpoint in the released nomic-embed-text-v2-moe format
(HF NomicBertModel remote code, `moe_every_n_layers` > 0), written here tensor by tensor (transformers has no such
class), with the tiny SentencePiece Unigram vocabulary of tools/gen_xlmr_fixture.py, converted to GGUF by llama.cpp's
own converter (conversion/bert.py NomicBertModel: GGUF arch `nomic-bert-moe`, tokenizer.ggml.model `t5`). Nothing
here imports minfer.

Two steps, in two environments (torch + transformers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_nomic_moe_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_nomic_moe_fixture.py goldens

`build`:
  the checkpoint   DIMS below: 4 layers, hidden 32, 4 heads, inner width 64, 4 experts, top-2, moe_every_n_layers 2
                   (the MoE layers are those with i % 2 == 1: 1 and 3; llama.cpp load_arch_tensors and the remote
                   code's rule; moe_every_n_layers 1 would make none). Released names: embeddings.word_embeddings /
                   token_type_embeddings (type_vocab_size 1), emb_ln, encoder.layers.N.attn.Wqkv (+ bias:
                   qkv_proj_bias), attn.out_proj (+ bias), norm1, norm2, a dense layer's mlp.fc1 / mlp.fc2 (+ biases),
                   a MoE layer's mlp.router.layer (E, D), mlp.experts.mlp.w1 / w2 (E*F, D) each and mlp.experts.bias
                   (D,) (the converter drops that bias: NomicBertModel.filter_tensors; llama.cpp never adds one).
                   Every value rounded to float16 first, so the f16 GGUF holds exactly what the reference ran. The
                   router's scale is larger than the other matrices' (ROUTER_SCALE), and SEED was picked (a search
                   over seeds with this reference) so that routing varies (every expert used on each MoE layer, 4+
                   different top-2 sets, 2+ within each text) and one text ("Hello world") is routed decisively (a
                   router logit gap of 0.34 between every token's 2nd and 3rd expert: the bf16 / int8 tests' input);
                   the json records each MoE layer's expert counts, top-2 sets and smallest logit gap, and each
                   input's. modules.json + 1_Pooling (mean) as sentence-transformers writes them, so the file carries
                   nomic-bert-moe.pooling_type 1 as the released GGUFs do.
  the vocabulary   gen_xlmr_fixture.make_tokenizer (sentencepiece.bpe.model + transformers' XLMRobertaTokenizer); the
                   converter's sentencepiece path realigns the pieces (<s> <pad> </s> <unk> + pieces[3:]) and, for
                   nomic-bert-moe only, writes <mask> at id 250001: the slot after XLM-R's 250,000 realigned pieces.
                   On this 200-piece vocabulary that index is out of range, so the converter runs with that one
                   constant read as (pieces + 1) (MASK_SLOT_PATCH): <mask> lands at id 201, the same slot.
  nomic-bert-moe.gguf  convert_hf_to_gguf.py --outtype f16.
  nomic-bert-moe.npz   ids_<i> (T,), hidden_<i> (T, D): an independent float64 numpy forward of the checkpoint
                   (reference() below, written from the architecture, not from minfer), GELU's tanh form (ggml_gelu's
                   formula) and the routing of build_moe_ffn (softmax over the experts, the top-k, the weights NOT
                   renormalized); hidden_tab_<i>: the same with ggml-cpu's float16 GELU table (x rounded to f16, the
                   f16 of gelu(x); 0 below -10, x above 10: ggml-cpu vec.h ggml_vec_gelu_f32 with GGML_GELU_FP16),
                   which is what llama.cpp's CPU computes; experts_<i>_<layer> (T, k): the chosen experts. Inputs:
                   TEXTS as the HF tokenizer encodes them (<s> ... </s>) and random ids of 40 and 100 tokens.
  nomic-bert-moe.json  the config, seed, DIMS, routing statistics, commands.

`goldens` writes tests/data/embed/goldens-nomic-moe.json.gz: llama.cpp's pooled embeddings of an F32 copy of the fixture
(gen_embed_goldens.embed: Llama.embed(normalize=False), F32 KV, no flash attention) for pooling mean / cls / last /
none and the file's own (mean), of TEXTS; its token ids of TOKEN_TEXTS (gen_bert_fixture.token_rows: add_special with
parse_special off and on, and neither); and how far llama.cpp's per-token rows are from the npz's two references.
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
NAME = "nomic-bert-moe"
SEED = 8461                         # picked for decisive, varied routing (build prints and records it)
DIMS = dict(D=32, L=4, H=4, F=64, E=4, K=2, EVERY=2)
EPS = 1e-5
THETA = 10000.0
VOCAB = 202                         # gen_xlmr_fixture.VOCAB (200 pieces) + <pad> realigned in + <mask>
ROUTER_SCALE = 4.0                  # router weights ~ N(0, (ROUTER_SCALE / sqrt(D))^2): decisive top-2 choices
TEXTS = ["Hello world", "the capital of china is beijing.", "Bonjour le monde, Ça va très bien ?",
         "東京は日本の首都です。 Привет мир"]
TOKEN_EXTRA = ["a <mask> b", "<mask>", "x <mask>y  <mask>"]
# conversion/bert.py _xlmroberta_set_vocab: `tokens[250001] = b'<mask>'` for NOMIC_BERT_MOE (see the docstring)
MASK_SLOT_PATCH = (
    "import inspect, textwrap\n"
    "import conversion.bert as _cb\n"
    "_src = textwrap.dedent(inspect.getsource(_cb.BertModel._xlmroberta_set_vocab))\n"
    "assert _src.count('250001') == 3, 'conversion/bert.py changed: its nomic-bert-moe <mask> slot'\n"
    "_ns = {}\n"
    "exec(compile(_src.replace('250001', '(tokenizer.vocab_size() + 1)'), _cb.__file__, 'exec'), vars(_cb), _ns)\n"
    "_cb.BertModel._xlmroberta_set_vocab = _ns['_xlmroberta_set_vocab']\n")


def moe_layer(i: int) -> bool:
    """llama.cpp src/models/nomic-bert-moe.cpp load_arch_tensors / bert.cpp: moe_every_n_layers > 0 and i % n == 1."""
    return DIMS["EVERY"] > 0 and i % DIMS["EVERY"] == 1


def checkpoint(seed: int) -> dict:
    """The released-format state dict (float32 numpy, every value float16-exact)."""
    import torch

    D, L, F, E = DIMS["D"], DIMS["L"], DIMS["F"], DIMS["E"]
    g = torch.Generator().manual_seed(seed)

    def mat(n, k, scale=1.5):
        return torch.randn(n, k, generator=g) * (scale / k ** 0.5)

    def vec(n, base=0.0):
        return base + 0.2 * torch.randn(n, generator=g)

    sd = {"embeddings.word_embeddings.weight": mat(VOCAB, D), "embeddings.token_type_embeddings.weight": mat(1, D),
          "emb_ln.weight": vec(D, 1.0), "emb_ln.bias": vec(D)}
    for i in range(L):
        p = f"encoder.layers.{i}."
        sd[p + "attn.Wqkv.weight"], sd[p + "attn.Wqkv.bias"] = mat(3 * D, D), vec(3 * D)
        sd[p + "attn.out_proj.weight"], sd[p + "attn.out_proj.bias"] = mat(D, D), vec(D)
        for n in ("norm1", "norm2"):
            sd[p + n + ".weight"], sd[p + n + ".bias"] = vec(D, 1.0), vec(D)
        if moe_layer(i):
            sd[p + "mlp.router.layer.weight"] = mat(E, D, ROUTER_SCALE)
            sd[p + "mlp.experts.mlp.w1"] = mat(E * F, D)                    # expert e: rows [eF, (e+1)F), x @ w1_e^T
            sd[p + "mlp.experts.mlp.w2"] = torch.randn(E * F, D, generator=g) * (1.5 / F ** 0.5)   # a_e @ w2_e
            sd[p + "mlp.experts.bias"] = vec(D)                             # dropped by the converter
        else:
            sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = mat(F, D), vec(F)
            sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = mat(D, F), vec(D)
    return {k: v.half().float().numpy() for k, v in sd.items()}


def write_model_dir(d: Path, sd: dict) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_xlmr_fixture import make_tokenizer

    make_tokenizer(d)
    save_file({k: torch.from_numpy(v).contiguous() for k, v in sd.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    D = DIMS["D"]
    (d / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": VOCAB,
        "n_embd": D, "n_layer": DIMS["L"], "n_head": DIMS["H"], "n_inner": DIMS["F"], "n_positions": 2048,
        "max_trained_positions": 2048, "activation_function": "gelu", "causal": False, "qkv_proj_bias": True,
        "mlp_fc1_bias": True, "mlp_fc2_bias": True, "prenorm": False, "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_emb_base": THETA,
        "layer_norm_epsilon": EPS, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
        "moe_every_n_layers": DIMS["EVERY"], "num_experts": DIMS["E"], "moe_top_k": DIMS["K"]}, indent=1))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": D, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))


# ---- the independent reference (float64 numpy, from the architecture description) ----

def layer_norm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + EPS) * w + b


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def gelu_table(x):
    """ggml-cpu's GELU on float32 input (vec.h ggml_vec_gelu_f32, GGML_GELU_FP16): 0 for x <= -10, x for x >= 10,
    else the table ggml_table_gelu_f16[f16(x)] = f16(ggml_gelu_f32(f16(x))) (ggml-cpu.c ggml_cpu_init)."""
    x32 = x.astype(np.float32)
    h = x32.astype(np.float16).astype(np.float32)
    c, a = np.float32(0.79788456080286535587989211986876), np.float32(0.044715)
    g = (np.float32(0.5) * h * (np.float32(1.0) + np.tanh(c * h * (np.float32(1.0) + a * h * h)))).astype(np.float16)
    out = np.where(x32 <= -10.0, 0.0, np.where(x32 >= 10.0, x32, g.astype(np.float32)))
    return out.astype(np.float64)


def rope_neox(x, T: int):
    """x (T, H, Dh): pairs (j, j + Dh/2) rotated by pos * THETA^(-2j/Dh) (NEOX; HF rotate_half)."""
    Dh = x.shape[-1]
    inv = THETA ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :Dh // 2], x[..., Dh // 2:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def reference(sd: dict, ids: list[int], table: bool = False):
    """Hidden rows (T, D) after the last layer's norm2, and the chosen experts per MoE layer {i: (T, k)}."""
    D, L, H, F, E, K = (DIMS[k] for k in ("D", "L", "H", "F", "E", "K"))
    gelu = gelu_table if table else gelu_tanh
    w = {k: v.astype(np.float64) for k, v in sd.items()}
    T, Dh = len(ids), D // H
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w["emb_ln.weight"], w["emb_ln.bias"])
    chosen = {}
    for i in range(L):
        p = f"encoder.layers.{i}."
        qkv = x @ w[p + "attn.Wqkv.weight"].T + w[p + "attn.Wqkv.bias"]
        q, k, v = (qkv[:, j * D:(j + 1) * D].reshape(T, H, Dh) for j in range(3))
        q, k = rope_neox(q, T), rope_neox(k, T)
        att = softmax(np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh))         # every key: bidirectional
        o = np.einsum("hts,shd->thd", att, v).reshape(T, D)
        x = layer_norm(x + o @ w[p + "attn.out_proj.weight"].T + w[p + "attn.out_proj.bias"],
                       w[p + "norm1.weight"], w[p + "norm1.bias"])
        if moe_layer(i):
            probs = softmax(x @ w[p + "mlp.router.layer.weight"].T)          # (T, E)
            top = np.argsort(-probs, axis=1, kind="stable")[:, :K]
            wt = np.take_along_axis(probs, top, 1)                           # not renormalized
            w1 = w[p + "mlp.experts.mlp.w1"].reshape(E, F, D)
            w2 = w[p + "mlp.experts.mlp.w2"].reshape(E, F, D)
            y = np.zeros((T, D))
            for t in range(T):
                for j in range(K):
                    e = top[t, j]
                    y[t] += wt[t, j] * (gelu(w1[e] @ x[t]) @ w2[e])
            chosen[i] = (top, probs)
        else:
            y = gelu(x @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"]) @ w[p + "mlp.fc2.weight"].T \
                + w[p + "mlp.fc2.bias"]
        x = layer_norm(x + y, w[p + "norm2.weight"], w[p + "norm2.bias"])
    return x, chosen


def build(llamacpp: Path) -> None:
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert

    sd = checkpoint(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        write_model_dir(d, sd)
        convert(d, ARCH / f"{NAME}.gguf", llamacpp, raw_config=True, extra=MASK_SLOT_PATCH)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(SEED)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == 0 and ids[-1] == 2 for ids in inputs), inputs
    inputs += [[0, *rng.integers(4, VOCAB - 1, size=n - 2).tolist(), 2] for n in (40, 100)]
    arrays, stats, gaps = {}, {}, {}
    K, E = DIMS["K"], DIMS["E"]
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        h, chosen = reference(sd, ids)
        arrays[f"hidden_{i}"] = h.astype(np.float32)
        arrays[f"hidden_tab_{i}"] = reference(sd, ids, table=True)[0].astype(np.float32)
        for layer, (top, probs) in chosen.items():
            arrays[f"experts_{i}_{layer}"] = top.astype(np.int64)
            s = stats.setdefault(str(layer), {"tokens_per_expert": [0] * E, "top_sets": set(), "min_gap": 1e9})
            for e in top.reshape(-1):
                s["tokens_per_expert"][int(e)] += 1
            s["top_sets"] |= {tuple(sorted(int(e) for e in row)) for row in top}
            srt = -np.sort(-np.log(probs), axis=1)                # router logits' gap, k-th to (k+1)-th
            gap = float((srt[:, K - 1] - srt[:, K]).min())
            s["min_gap"] = min(s["min_gap"], gap)
            gaps[i] = min(gaps.get(i, 1e9), gap)
    for s in stats.values():
        s["top_sets"] = sorted(s["top_sets"])
        assert len(s["top_sets"]) >= 4 and min(s["tokens_per_expert"]) > 0, s       # not degenerate
    np.savez_compressed(ARCH / f"{NAME}.npz", **arrays)
    (ARCH / f"{NAME}.json").write_text(json.dumps({
        "seed": SEED, "dims": DIMS, "eps": EPS, "rope_theta": THETA, "router_scale": ROUTER_SCALE, "texts": TEXTS,
        "moe_layers": [i for i in range(DIMS["L"]) if moe_layer(i)], "routing": stats,
        "router_logit_gap_per_input": [gaps[i] for i in range(len(inputs))],
        "transformers": transformers.__version__,
        "commands": [f"/work/tfvenv/bin/python tools/gen_nomic_moe_fixture.py build --llamacpp {llamacpp}",
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_nomic_moe_fixture.py goldens"]},
        indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{NAME}: {(ARCH / f'{NAME}.gguf').stat().st_size} bytes, {len(inputs)} inputs; routing "
          + "; ".join(f"layer {k}: {v['tokens_per_expert']} tokens per expert, {len(v['top_sets'])} expert sets, "
                      f"smallest logit gap {v['min_gap']:.3g}" for k, v in stats.items())
          + f"; per input {[round(gaps[i], 3) for i in range(len(inputs))]}")


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys, embed, write_json_gz
    from gen_xlmr_fixture import TOKEN_TEXTS

    import gen_embed_goldens
    gen_embed_goldens.TEXTS = TEXTS          # embed() embeds gen_embed_goldens.TEXTS
    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False) on an "
                     "F32 copy of tests/data/arch/nomic-bert-moe.gguf per pooling (and the file's: mean), "
                     "Llama.tokenize(text, add_bos, special); command: PYTHONPATH=/tmp/llcpp-site "
                     "/work/venv/bin/python tools/gen_nomic_moe_fixture.py goldens", "fixtures": {}, "tokens": {}}
    z = np.load(ARCH / f"{NAME}.npz")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(ARCH / f"{NAME}.gguf", f32, {}, f32=True)
        per = {}
        for pname, p in POOLINGS.items():
            per[pname] = embed(f32, p)
            assert per[pname]["pooling_type"] == p, pname
        per["file"] = embed(f32, None)
        assert per["file"]["pooling_type"] == 1, per["file"]["pooling_type"]
        out["fixtures"][NAME] = per
        llm = llama_cpp.Llama(str(ARCH / f"{NAME}.gguf"), vocab_only=True, verbose=False)
        out["tokens"][NAME] = token_rows(llm, TOKEN_TEXTS + TOKEN_EXTRA)
        del llm
    miss = {"tanh": 0.0, "table": 0.0}
    for i, inp in enumerate(per["none"]["inputs"]):
        assert inp["ids"] == z[f"ids_{i}"].tolist(), (inp["text"], inp["ids"])
        got = np.asarray(inp["embedding"], dtype=np.float64)
        for key, arr in (("tanh", z[f"hidden_{i}"]), ("table", z[f"hidden_tab_{i}"])):
            miss[key] = max(miss[key], float(np.abs(got - arr).max() / np.abs(arr).max()))
    out["measured"] = {"llama.cpp rows vs the npz reference, max abs / max |h|": miss}
    print(f"llama.cpp's rows vs the reference: tanh GELU {miss['tanh']:.2e}, ggml's f16 table {miss['table']:.2e}",
          file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    write_json_gz(OUT / "goldens-nomic-moe.json.gz", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and the numpy reference (needs torch, transformers, sentencepiece)")
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
