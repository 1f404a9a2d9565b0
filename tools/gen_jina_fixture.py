"""Make the jina-bert-v2 fixtures in tests/data/arch/ and their goldens tests/data/embed/goldens-jina.json.gz: tiny random
checkpoints in the layout of jinaai's remote-code JinaBert models (transformers has no JinaBert class), converted to
GGUF by llama.cpp's own converter (conversion/bert.py JinaBertV2Model), with an independent torch forward of the same
weights as a second reference and llama.cpp's own pooled embeddings, rerank scores and token ids as the goldens.
Nothing here imports minfer.

Two steps, in two environments (transformers + safetensors for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_jina_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_jina_fixture.py goldens

The fixtures (FIXTURES), each a model directory written here (config.json as the released checkpoints' own, read raw
by the converter; model.safetensors; gen_bert_fixture's WordPiece trainer on CORPUS, a BertTokenizer):
  jina-bert-v2       jina-embeddings-v2-base-en / -small-en: 4 heads (a power of two: ALiBi slopes 2^-2 .. 2^-8),
                     the GeGLU MLP's gate and up stacked in one `mlp.gated_layers` (2F, D) -> ffn_up, `mlp.wo`,
                     `mlp.layernorm`; sentence-transformers mean pooling (modules.json -> jina-bert-v2.pooling_type 1).
  jina-bert-v2-code  jina-embeddings-v2-base-code's layer: 6 heads (not a power of two: heads 4 and 5 take ggml's second
                     slope series), q / k LayerNorms (`attention.self.layer_norm_q` / `_k` -> attn_q_norm / _k_norm),
                     `layer_norm_1` -> attn_norm_2 (the layer input added again and normed), `mlp.up_gated_layer`
                     -> ffn_up (2F, D), `mlp.down_layer`, `layer_norm_2`; no pooling key.
  jina-bert-v2-rank  a jina-reranker-v1 style cross-encoder: `bert.`-prefixed weights and `classifier` (1, D) + bias
                     -> cls.weight / cls.bias (gguf-py tensor_mapping CLS "classifier  # jina"; no id2label in the
                     config, so BertModel.modify_tensors keeps the name); its two layers carry the two older MLP
                     spellings llama.cpp still loads, which its graph picks per layer: layer 0 the gate apart
                     (`mlp.gated_layers_w` -> ffn_gate, `mlp.gated_layers_v` -> ffn_up, as converters before llama.cpp
                     PR 14090 wrote GeGLU files), layer 1 feed_forward_type "original" (`intermediate.dense` with
                     its bias -> ffn_up (F, D), `output.dense`, `output.LayerNorm`: a plain GELU MLP, PR 18475).
The converter names the pre-tokenizer by hashing how the tokenizer splits a fixed text; these vocabularies are new, so
it runs with get_vocab_base_pre answering 'jina-v2-en' (what jina-embeddings-v2-base-en's files carry; a WordPiece
vocab's pre name changes nothing in llama.cpp). The released -code model and the rerankers have byte-level BPE vocabs
(pre 'jina-v2-code' / 'jina-v1-en'): those are the tokenizer's concern; the fixtures test the architecture.

`build` writes, for each fixture:
  <name>.gguf   convert_hf_to_gguf.py --outtype f16 (every random value rounded to float16 first, so the file holds
                exactly the weights the reference ran).
  <name>.npz    ids_<i>, hidden_<i> (T, D): the model as released (HF JinaBert: exact erf GELU; -code's
                up_gated_layer as `up * act(gate)`, up the FIRST half), hidden_ll_<i>: the function llama.cpp's graph
                computes on the same weights (src/models/bert.cpp: ggml_geglu = gelu_tanh(FIRST half) * second half for
                a stacked ffn_up, GELU's tanh form everywhere). Inputs: TEXTS by the HF tokenizer, random ids of 40 and
                200 tokens. For the reranker also pair_ids_<i> / pair_ll_<i>: PAIRS by the HF tokenizer ([CLS] q [SEP]
                d [SEP]) and llama.cpp's score function tanh(cls . h[CLS] + cls_b) with token types all 0.
  <name>.json   the config, the seed, the texts and pairs, and how far hidden and hidden_ll are apart.
The torch forward (reference_hidden) is written from the architecture (BERT post-norm layers, ALiBi's -m_h |i - j| on
the scaled scores with HF's _get_alibi_head_slopes, the GLU variants above), not from minfer.

`goldens` writes tests/data/embed/goldens-jina.json.gz: for each fixture llama.cpp's pooled embeddings
(llama-cpp-python 0.3.36 over its vendor/llama.cpp, Llama.embed(normalize=False) on an F32 copy, F32 KV, no flash
attention) of EMBED_TEXTS (two short, one of 188 tokens; the short two only for none) for mean / cls / last / none,
and with the file's pooling for jina-bert-v2; llama.cpp's token ids (Llama.tokenize) of gen_bert_fixture's
TOKEN_TEXTS on jina-bert-v2 (the three fixtures share one vocab); the reranker's scores (pooling RANK, each pair laid
out as llama-server's format_prompt_rerank, llama_get_embeddings_seq) as tools/gen_rerank_fixture.py makes them.

The WordPiece vocabulary is gen_bert_fixture.make_tokenizer's, trained on CORPUS below instead of README.md (whose
every edit would change the vocab and so the files): the same build gives the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "tests" / "data" / "arch"
OUT = ROOT / "tests" / "data" / "embed"
BASE = dict(vocab_size=400, type_vocab_size=2, layer_norm_eps=1e-12, max_position_embeddings=8192,
            position_embedding_type="alibi", hidden_act="gelu", pad_token_id=0, model_type="bert")
FIXTURES = {
    "jina-bert-v2": dict(seed=7311, prefix="", hidden_size=32, num_attention_heads=4, intermediate_size=64,
                         mlp=["glu", "glu"], qk_norm=False, norm_1=False, mean_pooling=True,
                         architectures=["JinaBertModel"], feed_forward_type="geglu"),
    "jina-bert-v2-code": dict(seed=7312, prefix="", hidden_size=48, num_attention_heads=6, intermediate_size=64,
                              mlp=["code", "code"], qk_norm=True, norm_1=True, mean_pooling=False,
                              architectures=["JinaBertModel"], feed_forward_type="geglu"),
    "jina-bert-v2-rank": dict(seed=7313, prefix="bert.", hidden_size=32, num_attention_heads=4, intermediate_size=64,
                              mlp=["split", "original"], qk_norm=False, norm_1=False, mean_pooling=False,
                              architectures=["JinaBertForMaskedLM"], feed_forward_type="geglu", classifier=True),
}
N_LAYERS = 2
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it",
         "Hello world, naïve café 東京! The GGUF file: tokenizer.ggml.model=bert; 42 x\U0001F600y"]
LONG = " ".join(["the model file holds the tokenizer and the weights; each layer reads the one before it."] * 6)
EMBED_TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it", LONG]
QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "gravity pulls the cat down", "a model file: tokenizer and weights",
        "naïve café 東京", "beijing", "the dog sat on the mat and then the cat came in and sat beside it"]
PAIRS = [(QUERY, d) for d in DOCS] + [("hello world", "hello world")]
# the WordPiece vocab's training text (gen_bert_fixture.make_tokenizer reads it as its README.md)
CORPUS = """minfer runs a model file on the machine it finds: the weights, the tokenizer and the graph all come from
one GGUF file, written by the converter of llama.cpp. An encoder reads the whole input at once and returns one vector
for each token, or one vector for the text when the rows are pooled; the mean of the rows is what most embedding
models ask for. Attention with linear biases gives every head its own slope, so a key far from the query costs more
than a key near it, and no table of positions is needed: the model can read texts longer than those it was trained on.
The feed forward block multiplies a gated half by the other half after a gelu; the layer norms come after each
residual add. A reranker scores a query and a document together: the first row goes through a small classifier and
the score tells how well the document answers the question. Tests compare every number with the reference, and a
change that breaks one rule should fail at least one test, with a message that names the file, the tensor or the key.
Hello world, the cat sat on the mat, and then the dog came in and sat beside it; the capital of china is beijing.
Gravity pulls the cat down. Numbers such as 42, 3.14159 and 1,000,000 appear in text too, with symbols like + and =.
naïve café résumé über straße 東京 日本 中文 テキスト
"""
MAX_BIAS = 8.0      # llama.cpp llama_model_jina_bert_v2::load_arch_hparams: f_max_alibi_bias = 8.0f (HF: the paper's 8)


# ---- the checkpoint ----

def state_dict(spec: dict, seed: int) -> dict:
    """Random weights in the released checkpoints' names (module doc), every value float16-exact: matrices
    randn * 1.5 / sqrt(fan_in), LayerNorm weights 1 + 0.2 randn, biases 0.2 randn."""
    import torch

    g = torch.Generator().manual_seed(seed)
    D, F, V, p = spec["hidden_size"], spec["intermediate_size"], BASE["vocab_size"], spec["prefix"]
    sd: dict = {}

    def mat(name, rows, cols, bias=True, scale=1.5):
        sd[name + ".weight"] = torch.randn(rows, cols, generator=g) * (scale / cols ** 0.5)
        if bias:
            sd[name + ".bias"] = 0.2 * torch.randn(rows, generator=g)

    def norm(name, n=D):
        sd[name + ".weight"] = 1.0 + 0.2 * torch.randn(n, generator=g)
        sd[name + ".bias"] = 0.2 * torch.randn(n, generator=g)

    sd[p + "embeddings.word_embeddings.weight"] = torch.randn(V, D, generator=g) * (1.5 / D ** 0.5)
    sd[p + "embeddings.token_type_embeddings.weight"] = torch.randn(BASE["type_vocab_size"], D, generator=g) * 0.5
    norm(p + "embeddings.LayerNorm")
    for i, kind in enumerate(spec["mlp"]):
        s = f"{p}encoder.layer.{i}."
        for x in ("query", "key", "value"):
            mat(s + f"attention.self.{x}", D, D)
        if spec["qk_norm"]:
            norm(s + "attention.self.layer_norm_q")
            norm(s + "attention.self.layer_norm_k")
        mat(s + "attention.output.dense", D, D)
        norm(s + "attention.output.LayerNorm")
        if kind == "glu":
            mat(s + "mlp.gated_layers", 2 * F, D, bias=False)
            mat(s + "mlp.wo", D, F)
            norm(s + "mlp.layernorm")
        elif kind == "code":
            norm(s + "layer_norm_1")
            mat(s + "mlp.up_gated_layer", 2 * F, D, bias=False)
            mat(s + "mlp.down_layer", D, F)
            norm(s + "layer_norm_2")
        elif kind == "split":
            mat(s + "mlp.gated_layers_w", F, D, bias=False)      # the gate (the stacked matrix's first half)
            mat(s + "mlp.gated_layers_v", F, D, bias=False)      # the up (its second half)
            mat(s + "mlp.wo", D, F)
            norm(s + "mlp.layernorm")
        else:                                                    # feed_forward_type "original"
            mat(s + "intermediate.dense", F, D)
            mat(s + "output.dense", D, F)
            norm(s + "output.LayerNorm")
    if spec.get("classifier"):
        mat("classifier", 1, D, scale=0.4)     # scores spread over tanh's range, not saturated
    else:
        mat(p + "pooler.dense", D, D)     # dropped by the converter (BertModel.filter_tensors)
    return {k: v.half().float().contiguous() for k, v in sd.items()}


def config(spec: dict) -> dict:
    c = dict(BASE, architectures=spec["architectures"], hidden_size=spec["hidden_size"],
             num_hidden_layers=N_LAYERS, num_attention_heads=spec["num_attention_heads"],
             intermediate_size=spec["intermediate_size"], feed_forward_type=spec["feed_forward_type"],
             emb_pooler="mean", attn_implementation=None)
    return c


def sentence_transformers_files(path: Path, dim: int) -> None:
    """modules.json and 1_Pooling/config.json as jina-embeddings-v2's repos carry them (mean pooling)."""
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dim, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))


# ---- the independent reference ----

def hf_alibi_slopes(n_heads: int) -> list[float]:
    """JinaBert's _get_alibi_head_slopes (the ALiBi paper's; max bias 8)."""
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return pow2(n_heads)
    c = 2 ** math.floor(math.log2(n_heads))
    return pow2(c) + hf_alibi_slopes(2 * c)[0::2][:n_heads - c]


def reference_hidden(sd: dict, spec: dict, ids: list[int], llama: bool):
    """(T, D) float64 torch tensor: the last hidden rows. llama False: the model as released (HF JinaBert); True:
    llama.cpp's function of the same weights (GELU tanh; a stacked ffn_up's FIRST half through the GELU)."""
    import torch
    import torch.nn.functional as F

    sd = {k: v.double() for k, v in sd.items()}
    p, D, H = spec["prefix"], spec["hidden_size"], spec["num_attention_heads"]
    Fw, Dh, eps, T = spec["intermediate_size"], spec["hidden_size"] // spec["num_attention_heads"], \
        BASE["layer_norm_eps"], len(ids)
    act = (lambda x: F.gelu(x, approximate="tanh")) if llama else F.gelu

    def ln(x, name):
        return F.layer_norm(x, (x.shape[-1],), sd[name + ".weight"], sd[name + ".bias"], eps)

    def lin(x, name):
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    x = sd[p + "embeddings.word_embeddings.weight"][torch.tensor(ids)] \
        + sd[p + "embeddings.token_type_embeddings.weight"][0]
    x = ln(x, p + "embeddings.LayerNorm")
    slopes = torch.tensor(hf_alibi_slopes(H), dtype=torch.float64)
    pos = torch.arange(T)
    bias = -slopes[:, None, None] * (pos[None, :] - pos[:, None]).abs().double()[None]       # (H, T, T)
    for i, kind in enumerate(spec["mlp"]):
        s = f"{p}encoder.layer.{i}."
        q, k, v = (lin(x, s + f"attention.self.{n}") for n in ("query", "key", "value"))
        if spec["qk_norm"]:
            q, k = ln(q, s + "attention.self.layer_norm_q"), ln(k, s + "attention.self.layer_norm_k")
        q, k, v = (t.view(T, H, Dh).transpose(0, 1) for t in (q, k, v))
        scores = q @ k.transpose(1, 2) / math.sqrt(Dh) + bias
        o = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, D)
        h = ln(lin(o, s + "attention.output.dense") + x, s + "attention.output.LayerNorm")
        if kind == "code":
            h = ln(x + h, s + "layer_norm_1")           # JinaBertLayer: layer_norm_1(residual + attention_output)
            u = lin(h, s + "mlp.up_gated_layer")
            a, b = u[:, :Fw], u[:, Fw:]
            m = act(a) * b if llama else a * act(b)     # HF: up (first half) * act(gated, second half)
            x = ln(h + lin(m, s + "mlp.down_layer"), s + "layer_norm_2")
            continue
        if kind == "glu":
            u = lin(h, s + "mlp.gated_layers")
            m = act(u[:, :Fw]) * u[:, Fw:]               # HF: act(gated, first half) * non_gated
            down, out = "mlp.wo", "mlp.layernorm"
        elif kind == "split":
            m = act(lin(h, s + "mlp.gated_layers_w")) * lin(h, s + "mlp.gated_layers_v")
            down, out = "mlp.wo", "mlp.layernorm"
        else:
            m = act(lin(h, s + "intermediate.dense"))
            down, out = "output.dense", "output.LayerNorm"
        x = ln(h + lin(m, s + down), s + out)
    return x


def make_vocab(gb, d: Path) -> None:
    """gen_bert_fixture.make_tokenizer (module gb) into d, trained on CORPUS: its ROOT pointed at a directory whose
    README.md is CORPUS for the call."""
    with tempfile.TemporaryDirectory() as t:
        (Path(t) / "README.md").write_text(CORPUS, encoding="utf-8")
        old, gb.ROOT = gb.ROOT, Path(t)
        try:
            gb.make_tokenizer(d)
        finally:
            gb.ROOT = old


def build(name: str, spec: dict, llamacpp: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen_bert_fixture
    from gen_arch_fixtures import convert
    from gen_bert_fixture import VOCAB

    assert VOCAB == BASE["vocab_size"]
    seed = spec["seed"]
    sd = state_dict(spec, seed)
    cfg = config(spec)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        d.mkdir()
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        make_vocab(gen_bert_fixture, d)
        if spec["mean_pooling"]:
            sentence_transformers_files(d, spec["hidden_size"])
        tc = json.loads((d / "tokenizer_config.json").read_text())
        assert tc.get("tokenizer_class") in ("BertTokenizer", "BertTokenizerFast"), tc.get("tokenizer_class")
        tc["tokenizer_class"] = "BertTokenizer"     # JinaBertV2Model.set_vocab reads this name
        (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
        convert(d, ARCH / f"{name}.gguf", llamacpp, raw_config=True,
                extra="base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'jina-v2-en'\n")
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(seed)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == 2 and ids[-1] == 3 for ids in inputs), inputs
    inputs += [[2, *rng.integers(5, VOCAB, size=n - 2).tolist(), 3] for n in (40, 200)]
    arrays: dict = {}
    with torch.no_grad():
        for i, ids in enumerate(inputs):
            arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
            arrays[f"hidden_{i}"] = reference_hidden(sd, spec, ids, llama=False).float().numpy()
            arrays[f"hidden_ll_{i}"] = reference_hidden(sd, spec, ids, llama=True).float().numpy()
        if spec.get("classifier"):
            w, b = sd["classifier.weight"].double(), sd["classifier.bias"].double()
            for i, (q, doc) in enumerate(PAIRS):
                ids = tok(q, doc)["input_ids"]
                arrays[f"pair_ids_{i}"] = np.array(ids, dtype=np.int64)
                h0 = reference_hidden(sd, spec, ids, llama=True)[0]
                arrays[f"pair_ll_{i}"] = torch.tanh(w @ h0 + b).float().numpy()   # build_pooling RANK with `cls`
    np.savez_compressed(ARCH / f"{name}.npz", **arrays)
    apart = max(float(np.abs(arrays[f"hidden_{i}"] - arrays[f"hidden_ll_{i}"]).max()
                      / np.abs(arrays[f"hidden_{i}"]).max()) for i in range(len(inputs)))
    (ARCH / f"{name}.json").write_text(json.dumps({
        "generator": "tools/gen_jina_fixture.py", "seed": seed, "texts": TEXTS, "config": cfg,
        "pairs": PAIRS if spec.get("classifier") else None, "mlp_per_layer": spec["mlp"],
        "transformers_tokenizer": transformers.__version__,
        "released_vs_llama_function_max_rel": apart}, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"{name}: {(ARCH / f'{name}.gguf').stat().st_size} bytes, {len(inputs)} inputs; the released model vs "
          f"llama.cpp's function: hidden rows apart by {apart:.2e} (max abs / max |h|)")


# ---- llama.cpp's goldens ----

def embed_rows(path: Path, pooling: int | None) -> dict:
    """Llama.embed(normalize=False) of EMBED_TEXTS (as gen_embed_goldens.embed, with a context that holds LONG; pooling
    none: the two short texts only, a vector per token)."""
    import llama_cpp

    kw = {} if pooling is None else {"pooling_type": pooling}
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False, **kw)
    out = []
    for text in EMBED_TEXTS[:2] if pooling == 0 else EMBED_TEXTS:
        ids = [int(t) for t in llm.tokenize(text.encode("utf-8"))]
        out.append({"text": text, "ids": ids, "embedding": llm.embed(text, normalize=False)})
    res = {"pooling_type": int(llm.pooling_type()), "inputs": out}
    del llm
    return res


def rank_rows(path: Path) -> dict:
    """llama.cpp's rerank scores of PAIRS (gen_rerank_fixture.goldens' way: the pair laid out from libllama's add
    flags, decoded as one sequence, llama_get_embeddings_seq[:n_cls_out])."""
    import llama_cpp
    from llama_cpp import llama_cpp as C

    llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=C.LLAMA_POOLING_TYPE_RANK, n_ctx=256,
                          n_batch=256, n_ubatch=256, n_threads=2, type_k=0, type_v=0, flash_attn=False,
                          verbose=False)
    model = llm._model.model
    vocab = C.llama_model_get_vocab(model)
    n_cls = int(C.llama_model_n_cls_out(model))
    flags = {"add_bos": bool(C.llama_vocab_get_add_bos(vocab)), "add_eos": bool(C.llama_vocab_get_add_eos(vocab)),
             "add_sep": bool(C.llama_vocab_get_add_sep(vocab)), "bos": int(C.llama_vocab_bos(vocab)),
             "eos": int(C.llama_vocab_eos(vocab)), "sep": int(C.llama_vocab_sep(vocab)), "n_cls_out": n_cls,
             "pooling_type": int(llm.pooling_type())}
    assert flags["pooling_type"] == C.LLAMA_POOLING_TYPE_RANK, flags
    eos = flags["eos"] if flags["eos"] != -1 else flags["sep"]     # LLAMA_TOKEN_NULL -> SEP
    pairs = []
    for q, doc in PAIRS:
        qt = [int(x) for x in llm.tokenize(q.encode("utf-8"), add_bos=False, special=False)]
        dt = [int(x) for x in llm.tokenize(doc.encode("utf-8"), add_bos=False, special=False)]
        ids = ([flags["bos"]] if flags["add_bos"] else []) + qt + ([eos] if flags["add_eos"] else []) \
            + ([flags["sep"]] if flags["add_sep"] else []) + dt + ([eos] if flags["add_eos"] else [])
        llm._batch.reset()
        llm._batch.add_sequence(ids, 0, True)
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        ptr = C.llama_get_embeddings_seq(llm._ctx.ctx, 0)
        pairs.append({"query": q, "document": doc, "ids": ids, "scores": [float(ptr[j]) for j in range(n_cls)]})
    del llm
    return {"vocab": flags, "pairs": pairs}


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_bert_fixture import TOKEN_TEXTS, token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False) on an "
                     "F32 copy of each fixture (F32 KV, no flash attention), Llama.tokenize(text, add_bos, special), "
                     "rerank scores with pooling RANK; command: PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python "
                     "tools/gen_jina_fixture.py goldens",
           "fixtures": {}, "tokens": {}, "rank": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in FIXTURES.items():
            f32 = Path(tmp) / f"{name}.gguf"
            copy_with_keys(ARCH / f"{name}.gguf", f32, {}, f32=True)
            per = {}
            for pname, p in POOLINGS.items():
                per[pname] = embed_rows(f32, p)
                assert per[pname]["pooling_type"] == p, (name, pname)
            if spec["mean_pooling"]:
                per["file"] = embed_rows(f32, None)
                assert per["file"]["pooling_type"] == 1, per["file"]["pooling_type"]
            out["fixtures"][name] = per
            if spec.get("classifier"):
                out["rank"][name] = rank_rows(f32)
            if name == "jina-bert-v2":     # the three share gen_bert_fixture's vocab
                llm = llama_cpp.Llama(str(ARCH / f"{name}.gguf"), vocab_only=True, verbose=False)
                out["tokens"][name] = token_rows(llm, TOKEN_TEXTS)
                del llm
            print(name, "ok", file=sys.stderr)
    dst = OUT / "goldens-jina.json.gz"
    # gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under a size limit
    import gzip

    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write((json.dumps(out, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))
    print("wrote", dst, file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and the torch reference's hidden rows (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    b.add_argument("--only", choices=sorted(FIXTURES), help="one fixture")
    sub.add_parser("goldens", help="llama.cpp's embeddings, scores and token ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        for name, spec in FIXTURES.items():
            if a.only in (None, name):
                build(name, spec, a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
