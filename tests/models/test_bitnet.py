"""BitNet b1.58 (minfer/models/bitnet.py) against transformers, on the CPU's float32 reference: each rule of the
graph needed (with one changed the logits miss by more than 10x the tolerance), the optional per-projection
`.scale` tensors of older files, TQ1_0 / TQ2_0 weights equal to the same weights in F32, what the model needs
refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers'
(names "bitnet", "bitnet-silu").

Fixtures (tools/gen_arch_fixtures.py with tools/bitnet_fixture.py's steps): transformers' BitNetForCausalLM,
converted by llama.cpp's convert_hf_to_gguf.py, which writes each projection as its ternary form times mean |W|;
the reference runs on those weights. tests/data/arch/bitnet.gguf: the 2B-4T's relu2 (bitnet.hidden_activation
written), GQA 2:1, theta 5e5; bitnet-silu.gguf: 1bitLLM's silu, no activation key, MHA."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

BASE_ERR = {"bitnet": 1.2e-6, "bitnet-silu": 8.0e-7}     # the fixtures' float32 misses (rel_err)
PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


@pytest.mark.parametrize("name", ["bitnet", "bitnet-silu"])
def test_layout_read_from_the_file(name):
    m = engine(name).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.d_model, c.ffn) == (16, 4, 64, 96)
    assert c.n_kv_heads == (2 if name == "bitnet" else 4)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_scale == 1.0
    assert c.rope.theta == (500000.0 if name == "bitnet" else 10000.0)
    assert c.tied_output and m.output is m.token_embd
    assert m.ffn_act == ("relu2" if name == "bitnet" else "silu")
    b = m.blocks[1]
    assert b.attn_sub_norm.shape == (64,) and b.ffn_sub_norm.shape == (96,) and b.scales is None
    w = b.ffn_down.dense                               # the converter's ternary form: one magnitude per tensor
    assert len(torch.unique(w.abs()[w != 0])) == 1


@pytest.mark.parametrize("name,what", [
    ("bitnet", "no_attn_sub_norm"), ("bitnet", "no_ffn_sub_norm"), ("bitnet", "silu_not_relu2"),
    ("bitnet", "norm_rope"), ("bitnet", "attn_sub_norm_after_o"),
    ("bitnet-silu", "relu2_not_silu"), ("bitnet-silu", "no_ffn_sub_norm"), ("bitnet-silu", "no_attn_sub_norm")])
def test_each_rule_is_needed(monkeypatch, name, what):
    """Both sub-norms (each alone skipped), the file's activation (relu2 for the 2B-4T style, silu for 1bitLLM's),
    NEOX rope (not NORM pairs), and the attention sub-norm before W_o (not after it)."""
    from minfer import ops

    eng = engine(name)
    m = eng.model
    assert miss(eng, name) < 10 * BASE_ERR[name]
    real_norm = m.sub_norm
    if what == "no_attn_sub_norm":
        monkeypatch.setattr(m, "sub_norm", lambda x, w: x if w.shape[0] == m.cfg.d_model else real_norm(x, w))
    elif what == "no_ffn_sub_norm":
        monkeypatch.setattr(m, "sub_norm", lambda x, w: x if w.shape[0] == m.cfg.ffn else real_norm(x, w))
    elif what == "silu_not_relu2":
        monkeypatch.setattr(m, "ffn_act", "silu")
    elif what == "relu2_not_silu":
        monkeypatch.setattr(m, "ffn_act", "relu2")
    elif what == "norm_rope":
        from dataclasses import replace

        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))    # (this engine's own cfg)
    else:                      # RMSNorm of W_o's output instead of its input
        monkeypatch.setattr(m, "sub_norm", lambda x, w: x if w.shape[0] == m.cfg.d_model else real_norm(x, w))
        real_attn = m.attention
        monkeypatch.setattr(m, "attention", lambda h, blk, i, cache, step, ctx: ops.rms_norm(
            real_attn(h, blk, i, cache, step, ctx), blk.attn_sub_norm, m.cfg.rms_eps))
    err = miss(eng, name)
    assert err > 10 * TOL, (what, err)


def scaled_file(tmp_path, name: str = "bitnet"):
    """The fixture as older converters wrote BitNet: each projection's ternary values {-1, 0, 1} alone and its
    scale as the one-value tensor blk.N.<proj>.scale (llama.cpp loads it TENSOR_NOT_REQUIRED)."""
    rd = gguf.GGUFReader(str(DATA / f"{name}.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    drop, add = [], {}
    for i in range(2):
        for p in PROJ:
            w = t[f"blk.{i}.{p}.weight"]
            s = np.float32(np.abs(w[w != 0]).max())
            drop.append(f"blk.{i}.{p}.weight")
            add[f"blk.{i}.{p}.weight"], add[f"blk.{i}.{p}.scale"] = w / s, np.array([s], np.float32)
    return rewrite(DATA / f"{name}.gguf", tmp_path / "scaled.gguf", drop_tensors=tuple(drop), add_tensors=add)


def test_scale_tensors_multiply_the_outputs(tmp_path, monkeypatch):
    """Ternary weights with their .scale tensors give transformers' logits, whole and in pieces through the cache;
    with the scales left out the logits miss (the weight-scale rule is needed)."""
    from minfer.runtime.engine import Engine

    eng = Engine.load(scaled_file(tmp_path), ctx=64, progress=False, switches=reference_switches())
    b = eng.model.blocks[0]
    assert set(b.scales) == set(PROJ) and set(torch.unique(b.attn_q.dense).tolist()) <= {-1.0, 0.0, 1.0}
    assert miss(eng, "bitnet") < 10 * BASE_ERR["bitnet"]
    r = ref("bitnet")
    ids = r["ids"].tolist()
    got = np.concatenate([eng.forward(ids[a:c], a).numpy() for a, c in ((0, 7), (7, 8), (8, len(ids)))])
    assert rel_err(got, r["logits"]) < TOL
    for blk in eng.model.blocks:
        monkeypatch.setattr(blk, "scales", None)
    assert miss(eng, "bitnet") > 10 * TOL


def test_scale_tensors_batch_engine_greedy(tmp_path):
    """The scaled form through the batch engine's paged cache (blocks of 4) next to a second sequence."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    r = ref("bitnet")
    eng = Engine.load(scaled_file(tmp_path), ctx=64, progress=False, switches=reference_switches())
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    outs = be.generate_many([r["prompt"].tolist(), r["ids"][10:25].tolist()], SamplingParams(temperature=0),
                            len(r["greedy"]))
    assert [ev.token_id for ev in outs[0]] == r["greedy"].tolist()


def test_scale_of_other_than_one_value_is_refused(tmp_path):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf", add_tensors={"blk.1.ffn_up.scale": np.ones(2, np.float32)})
    with pytest.raises(MinferError, match=r"blk\.1\.ffn_up\.scale' has 2 values, expected 1"):
        load(p)


# ---- TQ1_0 / TQ2_0 weights: a model wide enough for 256-value blocks, against the same weights in F32 ----

D, FF, V, H, HKV = 256, 512, 48, 4, 2


def tiny_file(path, qtype, act: str | None = "relu2", scales: bool = False):
    """A 2-layer bitnet of random ternary weights times one scale per tensor (the converter's form), the
    projections stored as `qtype` (F32: gguf's own decode of the TQ2_0 bytes, i.e. the same values)."""
    rng = np.random.default_rng(7)
    wr = gguf.GGUFWriter(str(path), "bitnet")
    for k, v in (("block_count", 2), ("context_length", 64), ("embedding_length", D), ("feed_forward_length", FF),
                 ("attention.head_count", H), ("attention.head_count_kv", HKV)):
        wr.add_uint32(f"bitnet.{k}", v)
    wr.add_float32("bitnet.attention.layer_norm_rms_epsilon", 1e-5)
    wr.add_float32("bitnet.rope.freq_base", 10000.0)
    if act is not None:
        wr.add_string("bitnet.hidden_activation", act)
    wr.add_tensor("token_embd.weight", rng.standard_normal((V, D)).astype(np.float32))
    wr.add_tensor("output_norm.weight", (1 + 0.2 * rng.standard_normal(D)).astype(np.float32))
    shapes = {"attn_q": (D, D), "attn_k": (HKV * D // H, D), "attn_v": (HKV * D // H, D), "attn_output": (D, D),
              "ffn_gate": (FF, D), "ffn_up": (FF, D), "ffn_down": (D, FF)}
    for i in range(2):
        for n, width in (("attn_norm", D), ("attn_sub_norm", D), ("ffn_norm", D), ("ffn_sub_norm", FF)):
            wr.add_tensor(f"blk.{i}.{n}.weight", (1 + 0.2 * rng.standard_normal(width)).astype(np.float32))
        for p, shp in shapes.items():
            s = np.float32(np.float16(1.5 / shp[1] ** 0.5))
            t = rng.integers(-1, 2, size=shp).astype(np.float32)
            t[:, ::256] = 1                                        # each block's max |x| is s
            if scales:
                wr.add_tensor(f"blk.{i}.{p}.scale", np.array([s], np.float32))
                s = np.float32(1)
            q = gguf.quants.quantize(t * s, gguf.GGMLQuantizationType.TQ2_0 if qtype == "F32" else qtype)
            if qtype == "F32":
                wr.add_tensor(f"blk.{i}.{p}.weight", gguf.quants.dequantize(q, gguf.GGMLQuantizationType.TQ2_0))
            else:
                wr.add_tensor(f"blk.{i}.{p}.weight", q, raw_dtype=qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def tiny_logits(path, toks):
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.runtime.kv_cache import KVCache

    m = load_model(GGUFFile(path), progress=False)
    return m, m.forward(toks, Step.at(0, len(toks), "cpu"), KVCache.for_config(m.cfg, 64))


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.TQ1_0, gguf.GGMLQuantizationType.TQ2_0],
                         ids=lambda t: t.name)
def test_ternary_types_equal_f32(tmp_path, qtype):
    """The released bitnet GGUFs' types: projections in TQ1_0 / TQ2_0 give the logits of the same weights in F32
    (bit for bit on the CPU: the decode is gguf's), with and without .scale tensors."""
    toks = torch.arange(1, 20) * 5 % V
    _, ref_out = tiny_logits(tiny_file(tmp_path / "f32.gguf", "F32"), toks)
    m, got = tiny_logits(tiny_file(tmp_path / "tq.gguf", qtype), toks)
    assert m.blocks[0].ffn_down.qtype == int(qtype) and m.ffn_act == "relu2"
    assert torch.equal(got, ref_out)
    _, sc = tiny_logits(tiny_file(tmp_path / "tq_s.gguf", qtype, scales=True), toks)
    assert float((sc - ref_out).norm() / ref_out.norm()) < 1e-5


# ---- refusals by name ----

def test_unknown_activation_is_refused(tmp_path):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf",
                set_keys={"bitnet.hidden_activation": ("gelu", gguf.GGUFValueType.STRING)})
    with pytest.raises(MinferError, match=r"bitnet\.hidden_activation 'gelu' is not supported for bitnet"):
        load(p)


def test_activation_of_another_type_is_refused(tmp_path):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf",
                set_keys={"bitnet.hidden_activation": (2, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"bitnet\.hidden_activation.*expected a string"):
        load(p)


def test_absent_activation_is_silu(tmp_path):
    """No key: llama.cpp's default silu (the 2B-4T's weights then run as llama.cpp runs them, and miss HF)."""
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf", drop_keys=("bitnet.hidden_activation",))
    assert load(p).ffn_act == "silu"


def test_output_tensor_is_refused(tmp_path):
    rd = gguf.GGUFReader(str(DATA / "bitnet.gguf"))
    emb = next(np.asarray(t.data, dtype=np.float32) for t in rd.tensors if t.name == "token_embd.weight")
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf", add_tensors={"output.weight": emb})
    with pytest.raises(MinferError, match=r"tensor 'output\.weight' is present, but llama\.cpp's bitnet"):
        load(p)


def test_q_width_other_than_d_is_refused(tmp_path):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf",
                set_keys={"bitnet.attention.key_length": (32, gguf.GGUFValueType.UINT32),
                          "bitnet.attention.value_length": (32, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match="bitnet's q width 4 x 32 differs from embedding_length 64"):
        load(p)


@pytest.mark.parametrize("key", ["bitnet.attention.layer_norm_rms_epsilon", "bitnet.block_count",
                                 "bitnet.feed_forward_length", "bitnet.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.0.attn_sub_norm.weight", "blk.1.ffn_sub_norm.weight", "blk.1.ffn_gate.weight",
                                    "blk.0.attn_k.weight", "blk.0.ffn_norm.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "bitnet.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_scaled_tq_model_cuda_backend_in_the_interpreter(tmp_path, monkeypatch):
    """TQ2_0 projections with .scale tensors through the CUDA backend's code in Triton's interpreter: the eager
    prefill and the host-free decode step within 1e-5 of the reference forward, on the TQ2_0 raw paths (the plain
    fixtures are tests/ops/test_arch_forward_interpreted.py's "bitnet" and "bitnet-silu")."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "ops"))
    from kernel_data import interpreted_modules, route_to_cuda

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    m = load_model(GGUFFile(tiny_file(tmp_path / "tq.gguf", gguf.GGMLQuantizationType.TQ2_0, scales=True)),
                   progress=False)
    toks = torch.arange(3, 13) * 7 % V
    T = len(toks)
    ref_cache, cache = KVCache.for_config(m.cfg, 64), KVCache.for_config(m.cfg, 64)
    ref_out = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)
    mods = interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                "minfer.ops.cuda.attention", "minfer.ops.cuda"])
    C = next(mods)["cuda"]
    try:
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        paths.reset()
        out = m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
        dec = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
        taken = set(paths.snapshot()["counts"])
    finally:
        monkeypatch.undo()
        next(mods, None)          # the modules reloaded as they were

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(out, ref_out) < 1e-5 and rel(dec, ref_dec) < 1e-5
    assert {"bitnet.scale.torch", "relu2.torch", "rms_norm.triton", "attention.decode.triton"} <= taken, taken
    assert any(p.startswith("qmatmul.TQ2_0.") for p in taken), taken
