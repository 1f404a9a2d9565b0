"""t5encoder (the encoder half of T5 as an embedding model: minfer/models/t5encoder.py) on the fixtures
tests/data/arch/t5encoder (gated GELU FFN, as t5-v1.1 / flan-t5; 2 layers, 4 heads of 8, 16 buckets) and
t5encoder-relu (the original T5's ReLU FFN; 3 layers, 4 heads of 12 over D 32, 32 buckets), made by
tools/gen_t5encoder_fixture.py: tiny random transformers T5EncoderModel's converted by llama.cpp's converter.

References, none of them minfer's: transformers' float32 last_hidden_state and its _relative_position_bucket
(t5encoder*.npz), llama.cpp's own pooled embeddings and token ids (tests/data/embed/goldens-t5encoder.json.gz:
attention_type non-causal, as llama_encode; also llama_encode's rows themselves, llama.cpp's default decode path,
and a copy with a per-layer bias table). Here: the hidden rows against transformers, each rule shown needed, the
bucket formula, the vectors against llama.cpp for every pooling, the Unigram tokenizer against llama.cpp,
`minfer embed`, generation refused, bad files refused by name."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
NAMES = ("t5encoder", "t5encoder-relu")
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-t5encoder.json.gz").read_bytes()))
TOL = 1e-5            # against transformers: the same formulas in float32 (measured <= 2.9e-7)
# against llama.cpp's vectors on an F32 copy: the ReLU fixture has no table-driven op (measured <= 5.3e-7); the gated
# one's GELU is ggml-cpu's float16 table (vec.h, GGML_GELU_FP16): measured <= 4.4e-4, with that table emulated 1.3e-4
TOL_LL = {"t5encoder": 2e-3, "t5encoder-relu": 1e-5}
TOL_LL_TABLE = 2e-4
_ENGINES: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _engines_freed():
    """The module's engines dropped after its tests."""
    yield
    _ENGINES.clear()


def path_of(name: str) -> Path:
    return DATA / "arch" / f"{name}.gguf"


def engine(name: str = "t5encoder", path: Path | None = None, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    path = path or path_of(name)
    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=256, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def npz(name: str):
    return np.load(DATA / "arch" / f"{name}.npz")


def ref(name: str) -> list[tuple[list[int], np.ndarray]]:
    z = npz(name)
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng, name: str) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h in ref(name))


def test_layout():
    """What each file holds, read as llama.cpp's t5encoder loader reads it."""
    g, r = engine("t5encoder").model, engine("t5encoder-relu").model
    for m, (L, Dh, nb, gated) in ((g, (2, 8, 16, True)), (r, (3, 12, 32, False))):
        c = m.cfg
        assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == (L, 32, 4, 4, Dh, 64,
                                                                                                256)
        assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-6)
        assert c.pooling_type == -1 and m.n_buckets == nb                # the converter writes no pooling_type
        assert m.blocks[0].attn_rel_b.shape == (nb, 4)                   # HF: block 0's relative_attention_bias only
        assert all(b.attn_rel_b is None for b in m.blocks[1:])
        assert all((b.ffn_gate is not None) == gated for b in m.blocks)
        assert tuple(m.blocks[0].attn_q.shape) == (4 * Dh, 32) and tuple(m.blocks[0].attn_output.shape) == (32, 4 * Dh)
        assert len(m.qweights()) == 1 + (7 if gated else 6) * L and m.rank_head is None


@pytest.mark.parametrize("name", NAMES)
def test_hidden_rows_match_transformers(name):
    """Every input (3 texts, 40 and 140 random ids): within 1e-5 of transformers' last_hidden_state."""
    assert hidden_miss(engine(name), name) < TOL


def test_bucket_formula_matches_transformers():
    """llama.cpp's llama_relative_position_bucket as minfer computes it (its float steps) = transformers'
    T5Attention._relative_position_bucket (bidirectional, max_distance 128) for every relative position -300..300,
    16 and 32 buckets: the exact ones, the log-spaced ones and the clamp at 128."""
    from minfer.models.t5encoder import relative_position_bucket

    for name in NAMES:
        z = npz(name)
        rp = torch.from_numpy(z["buckets_rel"].astype(np.int64))
        for key in (k for k in z.files if k.startswith("buckets_") and k != "buckets_rel"):
            nb = int(key.split("_")[1])
            want = z[key].astype(np.int64)
            assert len(set(want.tolist())) == nb - 1     # every bucket but n_buckets / 2 (rel > 0 with |rel| 0)
            assert (relative_position_bucket(rp, nb).numpy() == want).all(), (name, key)


def _layer_norm(x, w, eps):
    return F.layer_norm(x.float(), x.shape[-1:], w.float(), None, eps)


def _causal_sdpa(orig):
    """scaled_dot_product_attention with keys after the query masked (the fixtures' inputs go in one chunk)."""
    def f(q, k, v, attn_mask=None, scale=None):
        T = k.shape[-2]
        assert q.shape[-2] == T
        return orig(q, k, v, attn_mask=attn_mask + torch.full((T, T), float("-inf")).triu(1), scale=scale)
    return f


RULES = ["no_rel_bias", "bias_transposed", "bucket_linear", "bucket_max_distance_64", "attention_scale", "causal",
         "layer_norm_mean", "output_norm_weight", "ffn_gate_dropped", "gate_up_swapped", "gelu_erf", "relu_as_gelu"]


@pytest.mark.parametrize("what", RULES)
def test_each_rule_is_needed(monkeypatch, what):
    """The relative bias at all, its orientation (key - query), its bucket formula (log-spaced past max_exact, the
    clamp at max_distance 128), no 1/sqrt(Dh) scale, bidirectional attention, RMSNorm without the mean, the output
    norm's weight, the gated FFN (the gate, which half gets the GELU, GELU's tanh form) and the ReLU FFN: with any one
    changed the hidden rows miss transformers' by more than 10x the tolerance."""
    import minfer.models.t5encoder as t5

    name = "t5encoder-relu" if what == "relu_as_gelu" else "t5encoder"
    eng = engine(name)
    m = eng.model
    assert hidden_miss(eng, name) < TOL
    bucket = t5.relative_position_bucket
    if what == "no_rel_bias":
        monkeypatch.setattr(m.blocks[0], "attn_rel_b", torch.zeros_like(m.blocks[0].attn_rel_b))
    elif what == "bias_transposed":          # bucket(query - key)
        monkeypatch.setattr(t5, "relative_position_bucket", lambda r, n, md=128: bucket(-r, n, md))
    elif what == "bucket_linear":            # no log-spaced buckets: |rel| clamped
        monkeypatch.setattr(t5, "relative_position_bucket", lambda r, n, md=128: (r > 0).long() * (n // 2) +
                            r.abs().clamp(max=n // 2 - 1))
    elif what == "bucket_max_distance_64":
        monkeypatch.setattr(t5, "relative_position_bucket", lambda r, n, md=128: bucket(r, n, 64))
    elif what == "attention_scale":
        orig = t5.F.scaled_dot_product_attention
        monkeypatch.setattr(t5.F, "scaled_dot_product_attention", lambda q, k, v, attn_mask=None, scale=None: orig(
            q, k, v, attn_mask=attn_mask, scale=q.shape[-1] ** -0.5))
    elif what == "causal":
        monkeypatch.setattr(t5.F, "scaled_dot_product_attention", _causal_sdpa(t5.F.scaled_dot_product_attention))
    elif what == "layer_norm_mean":
        from minfer.ops import reference

        monkeypatch.setattr(reference, "rms_norm", lambda x, w, eps: _layer_norm(x, w, eps))
        monkeypatch.setattr(reference, "add_rms_norm", lambda x, y, w, eps, dt: (x + y, _layer_norm(x + y, w,
                                                                                                    eps).to(dt)))
    elif what == "output_norm_weight":
        monkeypatch.setattr(m, "output_norm", torch.ones_like(m.output_norm))
    elif what in ("ffn_gate_dropped", "gate_up_swapped"):
        for b in m.blocks:
            g, u = b.ffn_gate, b.ffn_up
            monkeypatch.setattr(b, "ffn_gate", None if what == "ffn_gate_dropped" else u)   # dropped: ReLU T5's FFN
            monkeypatch.setattr(b, "ffn_up", u if what == "ffn_gate_dropped" else g)
    elif what == "gelu_erf":
        monkeypatch.setattr(t5.ops, "geglu", lambda g, u: F.gelu(g) * u)
    else:                                    # relu_as_gelu: the ungated FFN with GELU instead of ReLU
        monkeypatch.setattr(t5.F, "relu", lambda x: F.gelu(x, approximate="tanh"))
    miss = hidden_miss(eng, name)
    print(f"{what}: {miss:.3g}")
    assert miss > 10 * TOL


def test_bidirectional_first_row_sees_the_last_token():
    """An encoder's first row depends on the tokens after it: changing only the last-but-one token moves row 0."""
    eng = engine()
    ids, h = ref("t5encoder")[3]
    other = ids[:-2] + [ids[-2] % 200 + 7, ids[-1]]
    a = np.asarray(eng.embed(ids, pooling="none", normalize=-1))
    b = np.asarray(eng.embed(other, pooling="none", normalize=-1))
    assert rel(a, h) < TOL and np.abs(a[0] - b[0]).max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_pooled_vectors_match_llamacpp(name, pooling):
    """Engine.embed against llama.cpp's own vectors (an F32 copy of the file, attention_type non-causal) for each
    pooling, not normalized (normalize=-1) and L2-normalized (the default), from the text and from llama.cpp's ids
    (which minfer's tokenizer gives the texts)."""
    eng = engine(name)
    d = GOLDENS["fixtures"][name][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3}[pooling] and not d["causal"]
    assert len(d["inputs"]) == 2
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        assert rel(eng.embed(inp["text"], pooling=pooling, normalize=-1), inp["embedding"]) < TOL_LL[name]
        assert rel(eng.embed(inp["text"], pooling=pooling), inp["embedding_normalized"]) < TOL_LL[name]
        assert rel(eng.embed(inp["ids"], pooling=pooling, normalize=-1), inp["embedding"]) < TOL_LL[name]


def _gelu_f16_table(x, approximate="tanh"):
    """ggml-cpu's GELU (vec.h ggml_vec_geglu_f32 under GGML_GELU_FP16): 0 at x <= -10, x at x >= 10, else the float16
    table of the tanh form at x rounded to float16."""
    y = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def test_gated_gap_to_llamacpp_is_mostly_ggmls_gelu_table(monkeypatch):
    """Most of the gated fixture's gap to llama.cpp is ggml-cpu's float16 GELU table: emulated, the largest miss over
    every pooling falls more than 3x (measured 4.4e-4 -> 1.3e-4; the ReLU fixture, without the table, is 5e-7)."""
    import minfer.models.t5encoder as t5

    eng = engine()

    def worst() -> float:
        return max(rel(eng.embed(inp["ids"], pooling=p, normalize=-1), inp["embedding"])
                   for p in ("mean", "cls", "last", "none") for inp in GOLDENS["fixtures"]["t5encoder"][p]["inputs"])

    plain = worst()
    monkeypatch.setattr(t5.ops, "geglu", lambda g, u: _gelu_f16_table(g.float()) * u.float())
    table = worst()
    print(f"plain {plain:.3g}, table emulated {table:.3g}")
    assert table < TOL_LL_TABLE and plain > 3 * table


@pytest.mark.parametrize("name", NAMES)
def test_llamacpp_encode_and_its_default_decode(monkeypatch, name):
    """llama_encode's rows (the encoder API; llama_context::encode never masks causally) are the non-causal goldens'
    and minfer's. llama.cpp's DEFAULT context (no attention_type: the file has no attention.causal) decodes with a KV
    cache and masks the encoder CAUSALLY: minfer matches that only with a causal mask, and misses it by far as is."""
    import minfer.models.t5encoder as t5

    fx = GOLDENS["fixtures"][name]
    enc = fx["none-encode"]
    assert enc["ids"] == fx["none"]["inputs"][1]["ids"] and enc["embedding"] == fx["none"]["inputs"][1]["embedding"]
    eng = engine(name)
    assert rel(eng.embed(enc["ids"], pooling="none", normalize=-1), enc["embedding"]) < TOL_LL[name]
    dec = fx["none-default-decode"]
    assert dec["causal"] and dec["inputs"][0]["ids"] == enc["ids"]
    want = dec["inputs"][0]["embedding"]
    assert rel(eng.embed(enc["ids"], pooling="none", normalize=-1), want) > 0.1
    monkeypatch.setattr(t5.F, "scaled_dot_product_attention", _causal_sdpa(t5.F.scaled_dot_product_attention))
    assert rel(eng.embed(enc["ids"], pooling="none", normalize=-1), want) < TOL_LL[name]


def test_a_layers_own_bias_table_is_used(tmp_path):
    """t5.cpp uses a layer's own attn_rel_b where the file has one, else layer 0's: the fixture with
    enc.blk.1.attn_rel_b.weight added matches llama.cpp's rows of that file, and not the fixture's own."""
    from models.test_arch_vs_transformers import rewrite

    rel_b = npz("t5encoder")["rel_b_1"]
    p = rewrite(path_of("t5encoder"), tmp_path / "rel_b_1.gguf", add_tensors={"enc.blk.1.attn_rel_b.weight": rel_b})
    eng = engine(path=p)
    assert eng.model.blocks[1].attn_rel_b is not None
    inp = GOLDENS["fixtures"]["t5encoder-rel-b-1"]["none"]["inputs"][0]
    got = eng.embed(inp["ids"], pooling="none", normalize=-1)
    assert rel(got, inp["embedding"]) < TOL_LL["t5encoder"]
    assert rel(engine().embed(inp["ids"], pooling="none", normalize=-1), inp["embedding"]) > 0.05


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_matches_llama_cpp(name):
    """llama.cpp's ids of the SentencePiece Unigram vocab the converter writes (tokenizer.ggml.model t5: no BOS,
    </s> appended): add_special with parse_special on and off, and neither; and the transformers reference's
    ids of its texts (sentencepiece's pieces, then </s>)."""
    tok = engine(name).tokenizer
    rows = GOLDENS["tokens"][name]
    assert len(rows) >= 9
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    texts = json.loads((DATA / "arch" / f"{name}.json").read_text())["texts"]
    for (ids, _), t, r in zip(ref(name), texts, rows):
        assert r["text"] == t and ids == r["special"] and ids[-1] == 1


def test_generation_is_refused_and_one_forward(capsys, monkeypatch):
    from minfer.cli import main

    eng = engine()
    msg = r"t5encoder is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([5, 50, 1])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([5, 50, 1], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    chunked = engine(MINFER_PREFILL_CHUNK=3)      # an encoder's input is one forward whatever the prefill chunk
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked, "t5encoder") < TOL
    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    assert main(["run", "-m", str(path_of("t5encoder")), "--device", "cpu", "hi"]) == 1
    assert "t5encoder is an encoder (bidirectional attention, no lm head): it only embeds" in capsys.readouterr().err


def test_cli_embed(capsys, monkeypatch):
    """`minfer embed --pooling mean` prints llama.cpp's unit vector; without --pooling (the file names none: the
    converter writes no pooling_type for T5) it says how to pool, naming the missing key."""
    from minfer.cli import main

    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    for name in NAMES:
        inp = GOLDENS["fixtures"][name]["mean"]["inputs"][1]
        assert main(["embed", "-m", str(path_of(name)), "--device", "cpu", "--pooling", "mean", inp["text"]]) == 0
        got = json.loads(capsys.readouterr().out.strip())
        assert rel(got, inp["embedding_normalized"]) < TOL_LL[name]
        assert abs(math.fsum(x * x for x in got) - 1) < 1e-5
    assert main(["embed", "-m", str(path_of("t5encoder")), "--device", "cpu", "hello"]) == 1
    err = capsys.readouterr().err
    assert "t5encoder.pooling_type is absent), so say how to pool" in err
    assert "not an embedding model's file" not in err       # an encoder's file: only a decoder's is called that


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("enc.blk.0.attn_rel_b.weight",)), "tensor 'enc.blk.0.attn_rel_b.weight' is missing"),
    (dict(drop_keys=("t5encoder.attention.relative_buckets_count",)), "'t5encoder.attention.relative_buckets_count'"
                                                                      " is missing"),
    (dict(drop_keys=("t5encoder.attention.layer_norm_rms_epsilon",)), "t5encoder.attention.layer_norm_rms_epsilon"),
    (dict(add_tensors={"enc.blk.0.attn_q.bias": np.zeros(32)}), "tensor 'enc.blk.0.attn_q.bias' is not part of a "
                                                                "t5encoder model"),
    (dict(add_tensors={"enc.blk.0.attn_qkv.weight": np.zeros((96, 32))}), "tensor 'enc.blk.0.attn_qkv.weight' is not"),
    (dict(add_tensors={"dec.blk.0.attn_q.weight": np.zeros((32, 32))}), "tensor 'dec.blk.0.attn_q.weight' is not"),
    (dict(drop_tensors=("enc.output_norm.weight",)), "enc.output_norm.weight"),
    (dict(drop_tensors=("enc.blk.1.ffn_up.weight",)), "enc.blk.1.ffn_up.weight"),
    (dict(drop_tensors=("enc.blk.0.attn_rel_b.weight",),
          add_tensors={"enc.blk.0.attn_rel_b.weight": np.zeros((8, 4))}),
     "tensor 'enc.blk.0.attn_rel_b.weight' has shape"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused("t5encoder", tmp_path, kw, match)


def test_bad_hyper_parameters_are_refused_by_name(tmp_path):
    import gguf

    from models.arch_checks import assert_refused

    U, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL
    assert_refused("t5encoder", tmp_path, dict(set_keys={"t5encoder.attention.value_length": (4, U)}),
                   "t5encoder.attention.value_length 4 != key_length 8")
    assert_refused("t5encoder", tmp_path, dict(set_keys={"t5encoder.attention.causal": (True, B)}),
                   "t5encoder.attention.causal is True")
    assert_refused("t5encoder", tmp_path, dict(set_keys={"t5encoder.attention.relative_buckets_count": (2, U)}),
                   "t5encoder.attention.relative_buckets_count is 2")
    assert_refused("t5encoder", tmp_path, dict(set_keys={"t5encoder.attention.head_count_kv": (2, U)}),
                   "t5encoder.attention.head_count_kv 2 != head_count 4")


def test_an_lm_head_tensor_is_accepted_and_not_read(tmp_path):
    """load_arch_tensors creates an optional `output.weight` the encoder graph never uses: a file with one loads and
    gives the same rows."""
    from models.test_arch_vs_transformers import rewrite

    p = rewrite(path_of("t5encoder"), tmp_path / "out.gguf", add_tensors={"output.weight": np.ones((256, 32))})
    assert hidden_miss(engine(path=p), "t5encoder") < TOL


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: mean vectors within cosine 0.999 of transformers'."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    for name in NAMES:
        eng = Engine.load(path_of(name), ctx=256, progress=False, switches=Switches(cpu_quant=True))
        for ids, h in ref(name)[3:]:
            got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
            want = h.astype(np.float64).mean(0)
            assert float(got @ want) / np.linalg.norm(want) > 0.999, name


_KERNEL_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
                "minfer.ops.cuda.layer_norm", "minfer.ops.cuda"]


@pytest.fixture(scope="module")
def cuda_ops():
    """The CUDA backend's modules under Triton's interpreter (tests/ops/kernel_data.py; CPU tensors)."""
    pytest.importorskip("triton")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
    from kernel_data import interpreted_modules

    yield from interpreted_modules(_KERNEL_MODS)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_backend_code_interpreted(cuda_ops, monkeypatch, name):
    """What the GPU runs, without a GPU (as tests/ops/test_arch_forward_interpreted.py does for bert): the embedding,
    RMSNorm, matmul and GeGLU kernels and the relative-bias attention's counted torch path; the hidden rows (all, and
    the last only) within 1e-5 of the reference forward."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.models.base import HiddenTaken
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    from kernel_data import route_to_cuda

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(path_of(name)), progress=False)
    toks = torch.arange(3, 23) * 7 % 250 + 3
    T = len(toks)

    def hidden(step, ctx=None):
        rows = []
        m.hidden_sink = rows.append
        try:
            with pytest.raises(HiddenTaken):
                m.forward(toks, step, None, ctx)
        finally:
            m.hidden_sink = None
        return rows[0]

    ref = hidden(Step.at(0, T, "cpu"))
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    out, last = hidden(Step.at(0, T, "cpu"), ctx), hidden(Step.at(0, T, "cpu", "last"), ctx)

    def relt(a, b):
        return float((a - b).norm() / b.norm())

    print(f"{name}: {relt(out, ref):.3g} {relt(last, ref[-1:]):.3g}")
    assert out.shape == (T, 32) and relt(out, ref) < 1e-5 and relt(last, ref[-1:]) < 1e-5
    snap = paths.snapshot()
    taken = set(snap["counts"]) | {k.split(" (")[0] for k in snap["fallbacks"]}
    assert "attention.relbias.torch" in taken, snap
    if name == "t5encoder":
        assert "geglu.triton" in taken, snap
