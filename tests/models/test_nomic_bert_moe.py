"""nomic-bert-moe (nomic-embed-text-v2-moe, embeddings only: minfer/models/nomic_bert_moe.py) on the fixture
tests/data/arch/nomic-bert-moe (tools/gen_nomic_moe_fixture.py: a tiny random checkpoint in the released format, 4
layers of which 1 and 3 are MoE (4 experts, top-2), an XLM-R Unigram vocab, converted by llama.cpp's converter).

References, none of them minfer's: the generator's independent float64 numpy forward (nomic-bert-moe.npz `hidden_<i>`,
GELU's tanh form; `hidden_tab_<i>` with ggml-cpu's float16 GELU table; `experts_<i>_<layer>` its top-2 choices) and
llama.cpp's own pooled vectors and token ids (tests/data/embed/goldens-nomic-moe.json.gz). Here: the hidden rows and the
routing against the numpy reference, each MoE rule shown needed (a broken gating fails, the restored one passes), the
vectors against llama.cpp, the tokenizer against llama.cpp, generation refused, bad files refused by name."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
NAME = "nomic-bert-moe"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-nomic-moe.json.gz").read_bytes()))
META = json.loads((DATA / "arch" / f"{NAME}.json").read_text(encoding="utf-8"))
TOL = 1e-5       # rel, float32 against the float64 numpy reference (measured <= 1.7e-6)
TOL_LL = 3e-3    # rel, against llama.cpp's vectors: ggml-cpu's float16 GELU table (measured <= 1.9e-3)
TOL_TAB = 3e-5   # rel, against llama.cpp's vectors of "Hello world" with that table in minfer too (measured <= 1.2e-5)
_ENGINES: dict = {}


def engine(path: Path = PATH, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref() -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"], z[f"hidden_tab_{i}"]) for i in range(n)]


def ref_experts(i: int, layer: int) -> np.ndarray:
    return np.load(DATA / "arch" / f"{NAME}.npz")[f"experts_{i}_{layer}"]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h, _ in ref())


def ggml_gelu_table(x: torch.Tensor) -> torch.Tensor:
    """ggml-cpu's GELU (vec.h ggml_vec_gelu_f32, GGML_GELU_FP16): 0 for x <= -10, x for x >= 10, else the float16 of
    ggml_gelu_f32(f16(x)) (ggml_table_gelu_f16)."""
    x = x.float()
    h = x.half().float()
    g = (0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * h * (1.0 + 0.044715 * h * h)))).half().float()
    return torch.where(x <= -10.0, torch.zeros_like(x), torch.where(x >= 10.0, x, g))


def test_layout():
    m = engine().model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.context_length) == \
        (4, 32, 4, 4, 8, 64, 512)
    assert (c.n_experts, c.n_experts_used, c.pooling_type) == (4, 2, 1)
    assert (c.rope.style, c.rope.theta, c.rope.n_rot) == ("neox", 10000.0, 8)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-5)
    assert m.type_row.shape == (32,) and m.position_embd is None
    assert [b.moe for b in m.blocks] == [False, True, False, True] == [i in META["moe_layers"] for i in range(4)]
    for i, b in enumerate(m.blocks):
        assert b.attn_qkv is not None and b.attn_qkv_b is not None and b.attn_output_b is not None
        if b.moe:
            assert b.gate_inp.shape == (4, 32) and b.gate_inp.dtype == torch.float32 and b.ffn_up is None
            assert [w.shape for w in b.up_exps] == [(64, 32)] * 4 and [w.shape for w in b.down_exps] == [(32, 64)] * 4
            assert b.up_exps[3].name == f"blk.{i}.ffn_up_exps.weight[expert 3]"
        else:
            assert b.ffn_up_b.shape == (64,) and b.ffn_down_b.shape == (32,) and b.gate_inp is None
    assert len(m.qweights()) == 1 + 2 * (2 + 2) + 2 * (2 + 8)      # embd; qkv, out + (up, down) or 4 + 4 experts


def test_hidden_rows_and_routing_match_the_reference(monkeypatch):
    """Every input (4 texts, 40 and 100 random ids) within 1e-5 of the numpy reference (measured <= 1.7e-6), and the
    experts minfer chooses for each token on each MoE layer are the reference's."""
    import minfer.models.nomic_bert_moe as nbm

    eng = engine()
    chosen, orig = [], nbm.route

    def spy(*a, **kw):
        w, idx = orig(*a, **kw)
        chosen.append(idx.sort(-1).values.cpu().numpy())
        return w, idx

    monkeypatch.setattr(nbm, "route", spy)
    for i, (ids, h, _) in enumerate(ref()):
        chosen.clear()
        assert rel(eng.embed(ids, pooling="none", normalize=-1), h) < TOL, i
        assert len(chosen) == len(META["moe_layers"])
        for layer, got in zip(META["moe_layers"], chosen):
            assert np.array_equal(got, np.sort(ref_experts(i, layer), -1)), (i, layer)


def test_the_routing_is_not_degenerate():
    """The fixture's routing (the reference's, which minfer's equals): on each MoE layer every expert serves some
    tokens, at least 4 different expert pairs are chosen, and within one text different tokens choose differently."""
    for layer in META["moe_layers"]:
        tops = [np.sort(ref_experts(i, layer), -1) for i in range(len(ref()))]
        allt = np.concatenate(tops)
        assert set(allt.reshape(-1).tolist()) == {0, 1, 2, 3}, layer
        assert len({tuple(r) for r in allt}) >= 4, layer
        for i in range(len(META["texts"])):
            assert len({tuple(r) for r in tops[i]}) >= 2, (layer, i)


def _route_variant(what: str):
    import minfer.models.nomic_bert_moe as nbm

    orig = nbm.route
    if what == "renormalized":      # norm_w true: the chosen weights divided by their sum
        return lambda h, r, k, norm, **kw: orig(h, r, k, True, **kw)
    if what == "top1":
        return lambda h, r, k, norm, **kw: orig(h, r, 1, norm, **kw)
    if what == "top_all":
        return lambda h, r, k, norm, **kw: orig(h, r, r.shape[0], norm, **kw)
    if what == "sigmoid":
        return lambda h, r, k, norm, **kw: orig(h, r, k, norm, gating="sigmoid")
    if what == "topk_softmax":      # softmax over the chosen k only (gpt-oss's order): renormalized weights too
        return lambda h, r, k, norm, **kw: orig(h, r, k, norm, gating="topk_softmax")
    if what == "smallest":          # the k least probable experts
        return lambda h, r, k, norm, **kw: orig(h, -r, k, norm, **kw)

    def uniform(h, r, k, norm, **kw):
        w, idx = orig(h, r, k, norm, **kw)
        return torch.full_like(w, 1.0 / k), idx
    return uniform


@pytest.mark.parametrize("what", ["renormalized", "top1", "top_all", "sigmoid", "topk_softmax", "smallest",
                                  "uniform_weights"])
def test_a_broken_gating_fails_then_the_restored_one_passes(monkeypatch, what):
    """build_moe_ffn's routing as bert.cpp calls it: softmax over all experts, the 2 largest, their probabilities as
    weights, not renormalized. Each change misses the reference by more than 100x the tolerance (measured: renormalized
    0.34, top-1 0.77, all experts 0.28, sigmoid 0.96, top-k softmax 0.34, smallest 2.2, uniform 0.91); put back, the
    rows match again."""
    import minfer.models.nomic_bert_moe as nbm

    eng = engine()
    assert hidden_miss(eng) < TOL
    monkeypatch.setattr(nbm, "route", _route_variant(what))
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 100 * TOL
    monkeypatch.undo()
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("what", ["gelu_erf", "no_dense_biases", "no_qkv_bias", "expert_down_swapped", "moe_dense"])
def test_each_other_rule_is_needed(monkeypatch, what):
    """GELU's tanh form, the dense layers' ffn biases, the qkv bias, each expert's own matrices, and the MoE layers
    being MoE: with any one changed the rows miss the reference by more than 10x the tolerance (measured: erf GELU
    6.3e-4, no dense biases 1.07, no qkv bias 1.19, experts 0/1 down swapped 1.48, expert 0 on every token 1.58)."""
    import minfer.models.nomic_bert_moe as nbm

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "gelu_erf":
        monkeypatch.setattr(nbm, "gelu", lambda x: torch.nn.functional.gelu(x.float()))
    elif what == "no_dense_biases":
        for b in m.blocks:
            if not b.moe:
                monkeypatch.setattr(b, "ffn_up_b", None)
                monkeypatch.setattr(b, "ffn_down_b", None)
    elif what == "no_qkv_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_qkv_b", None)
    elif what == "expert_down_swapped":
        for b in m.blocks:
            if b.moe:
                d = list(b.down_exps)
                monkeypatch.setattr(b, "down_exps", [d[1], d[0], *d[2:]])
    else:     # every token to expert 0 with weight 1 (and 0 on its second slot): a dense layer of expert 0's matrices
        def expert0(h, r, k, norm, **kw):
            w = torch.zeros(h.shape[0], k, device=h.device)
            w[:, 0] = 1.0
            return w, torch.zeros(h.shape[0], k, dtype=torch.long, device=h.device)

        monkeypatch.setattr(nbm, "route", expert0)
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 10 * TOL
    monkeypatch.undo()
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none", "file"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (goldens-nomic-moe.json.gz, an F32 copy of the file) within 3e-3
    (measured <= 1.9e-3: the GELU table, next test),
    raw and normalized (euclidean, the default); 'file': no pooling asked, the file's mean. The goldens' ids are what
    minfer's tokenizer gives the texts."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3, "file": 1}[pooling]
    assert len(d["inputs"]) == 4
    p = None if pooling == "file" else pooling
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"]) == inp["ids"]
        want = np.asarray(inp["embedding"], dtype=np.float64)
        assert rel(eng.embed(inp["text"], pooling=p, normalize=-1), want) < TOL_LL, (pooling, inp["text"])
        unit = want / np.linalg.norm(want, axis=-1, keepdims=True)
        assert rel(eng.embed(inp["text"], pooling=p), unit) < TOL_LL, (pooling, inp["text"])


def test_llamacpp_differs_only_by_ggmls_gelu_table(monkeypatch):
    """The 3e-3 above is ggml-cpu's float16 GELU table: the generator measured llama.cpp's rows 5.5e-4 from the numpy
    reference with that table, 1.4e-3 from the formula (a table lookup jumps where float noise moves its input across
    a float16 rounding boundary, so the table's own miss is not ~1e-6); and minfer with the table swapped in gives
    llama.cpp's vectors of "Hello world" (few such crossings there) within 3e-5 in every pooling (measured <= 1.2e-5),
    where the formula misses them by more than 5e-4 (measured >= 1.0e-3)."""
    import minfer.models.nomic_bert_moe as nbm

    measured = GOLDENS["measured"]["llama.cpp rows vs the npz reference, max abs / max |h|"]
    assert measured["table"] < 1e-3 < measured["tanh"] < TOL_LL
    eng = engine()
    gold = {p: GOLDENS["fixtures"][NAME][p]["inputs"][0] for p in ("mean", "cls", "last", "none")}
    assert all(g["text"] == "Hello world" for g in gold.values())
    assert min(rel(eng.embed(g["ids"], pooling=p, normalize=-1), g["embedding"]) for p, g in gold.items()) > 5e-4
    monkeypatch.setattr(nbm, "gelu", ggml_gelu_table)
    for p, g in gold.items():
        assert rel(eng.embed(g["ids"], pooling=p, normalize=-1), g["embedding"]) < TOL_TAB, p


def test_tokenizer_matches_llama_cpp():
    """llama.cpp's ids (add_special: <s> ... </s>; parse_special on and off; neither) of texts with accents, CJK,
    Cyrillic, full-width letters, special-token texts, <mask> (which strips the space before it for this arch) and
    odd spaces; the reference's ids of its texts are llama.cpp's."""
    tok = engine().tokenizer
    rows = GOLDENS["tokens"][NAME]
    assert len(rows) >= 15 and any("<mask>" in r["text"] for r in rows)
    mask = [r for r in rows if r["text"] == "a <mask> b"][0]
    assert 201 in mask["special_parsed"] and 201 not in mask["special"]
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    for (ids, _, _), t in zip(ref(), META["texts"]):
        assert ids == tok.encode(t)


def test_generation_is_refused_and_one_forward():
    """Engine.logits refused with bert's one-line message naming nomic-bert-moe; an input goes through one forward
    whatever the prefill chunk; a step not at position 0 is refused."""
    from minfer.models.base import Step

    eng = engine()
    with pytest.raises(MinferError, match=r"nomic-bert-moe is an encoder \(bidirectional attention, no lm head\)"):
        eng.logits([0, 50, 2])
    chunked = engine(MINFER_PREFILL_CHUNK=3)
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL
    with pytest.raises(MinferError, match="one forward from position 0"):
        eng.model.forward(torch.tensor([5, 6]), Step.at(3, 2, "cpu"), eng.cache, eng.ctx)


def _u32(v):
    import gguf

    return (v, gguf.GGUFValueType.UINT32)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("nomic-bert-moe.expert_count",)),
     "moe_every_n_layers=2 makes layers [1, 3] MoE layers, but metadata key 'nomic-bert-moe.expert_count'"),
    (dict(set_keys={"nomic-bert-moe.expert_used_count": _u32(5)}), "expert_count=4, expert_used_count=5"),
    (dict(set_keys={"nomic-bert-moe.moe_every_n_layers": _u32(3)}),
     "'blk.3.ffn_gate_inp.weight': layer 3 is a dense layer (moe_every_n_layers=3)"),
    (dict(set_keys={"nomic-bert-moe.moe_every_n_layers": _u32(1)}), "'blk.1.ffn_gate_inp.weight': layer 1 is a dense"),
    (dict(drop_keys=("nomic-bert-moe.moe_every_n_layers",)), "'blk.1.ffn_gate_inp.weight': layer 1 is a dense"),
    (dict(set_keys={"nomic-bert-moe.expert_group_count": _u32(2)}), "expert_group_count=2: group-limited routing"),
    (dict(drop_tensors=("blk.1.ffn_gate_inp.weight",)), "tensor 'blk.1.ffn_gate_inp.weight' is missing"),
    (dict(drop_tensors=("blk.3.ffn_down_exps.weight",)), "tensor 'blk.3.ffn_down_exps.weight' is missing"),
    (dict(drop_tensors=("blk.1.ffn_up_exps.weight",), add_tensors={"blk.1.ffn_up_exps.weight": np.zeros((2, 64, 32))}),
     "'blk.1.ffn_up_exps.weight' has shape (2, 64, 32), expected (4, 64, 32)"),
    (dict(drop_tensors=("blk.1.ffn_gate_inp.weight",), add_tensors={"blk.1.ffn_gate_inp.weight": np.zeros((3, 32))}),
     "'blk.1.ffn_gate_inp.weight' has shape (3, 32), expected (4, 32)"),
    (dict(add_tensors={"blk.1.ffn_down_exps.bias": np.zeros((4, 32))}), "'blk.1.ffn_down_exps.bias': layer 1 is a MoE"),
    (dict(add_tensors={"blk.1.ffn_up.weight": np.zeros((64, 32))}), "'blk.1.ffn_up.weight': layer 1 is a MoE layer"),
    (dict(add_tensors={"blk.0.ffn_gate.weight": np.zeros((64, 32))}), "'blk.0.ffn_gate.weight': layer 0 is a dense"),
    (dict(drop_tensors=("blk.2.ffn_up.weight",)), "tensor 'blk.2.ffn_up.weight' is missing"),
    (dict(drop_keys=("tokenizer.ggml.token_type_count",)), "'tokenizer.ggml.token_type_count' is missing"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    """Each message names the file's key or tensor (the match is literal text)."""
    import re

    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, re.escape(match).replace(r"\.", "."))    # assert_refused escapes the dots


@pytest.fixture(scope="module")
def cuda_ops():
    """minfer.ops.cuda's kernel modules under Triton's interpreter (tests/ops/kernel_data.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
    from kernel_data import DENSE_MODS, interpreted_modules

    yield from interpreted_modules(DENSE_MODS)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_the_cuda_backends_code_interpreted(cuda_ops, monkeypatch):
    """The forward through the CUDA backend's code (Triton's interpreter on CPU tensors, float32 activations:
    tests/ops/test_forward_interpreted.py's harness): its embedding, LayerNorm and rope kernels (8-wide heads) and its
    F16 matmuls on every expert's own (64, 32) / (32, 64) rows, at the few rows routed to one expert (the GEMV) and
    at more (the prefill GEMM): the hidden rows within 1e-5 of the reference (measured <= 1.2e-6)."""
    from kernel_data import route_to_cuda

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.models.base import HiddenTaken, Step
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.embed import NoCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(PATH), progress=False)
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    for i in (0, 2, 4):
        ids, h, _ = ref()[i]
        rows = []
        m.hidden_sink = rows.append
        with pytest.raises(HiddenTaken):
            m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu", "all"), NoCache(128), ctx)
        assert rel(rows[0].float().numpy(), h) < TOL, i
    counts = paths.snapshot()["counts"]
    assert counts["rope.triton"] == 2 * 3 * 4 and counts["layer_norm.triton"] == 3 * 9
    assert counts["qmatmul.F16.prefill"] > 0 and counts["qmatmul.F16.decode"] > 0


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: every matrix int8 (each expert its own), mean vectors of the inputs with
    decisive routing (the generator's router gaps) within cosine 0.999 of the reference's."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    eng = Engine.load(PATH, ctx=128, progress=False, switches=Switches(cpu_quant=True))
    assert eng.cpu_quant_report["int8_only"] is True
    gaps, checked = META["router_logit_gap_per_input"], 0
    for (ids, h, _), gap in zip(ref(), gaps):
        if gap < 0.3:       # a router logit gap int8's rounding could close: another expert, another vector
            continue
        checked += 1
        got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
        want = h.astype(np.float64).mean(0)
        print(f"{len(ids)} tokens: cosine {float(got @ want) / np.linalg.norm(want):.6f}")
        assert float(got @ want) / np.linalg.norm(want) > 0.999
    assert checked >= 1
