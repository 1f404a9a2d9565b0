"""Chameleon (minfer/models/chameleon.py) against transformers, on the CPU's float32 reference: each rule of the graph
needed (with one changed the logits miss by more than 10x the tolerance), llama.cpp's image-token suppression on a
vocabulary that holds ids 4..8195, what the model needs refused by name. The logits, greedy continuation, KV cache
in pieces and paged cache are test_arch_vs_transformers' (names "chameleon", "chameleon-swin").

Fixtures (tools/gen_arch_fixtures.py, whose LLAMACPP_RULES shared_head_norms sets every head's q/k norm row to one
row, as llama.cpp's converter writes them): transformers' ChameleonForConditionalGeneration, converted by
llama.cpp's convert_hf_to_gguf.py (conversion/chameleon.py). chameleon.gguf: pre-norm layers; chameleon-swin.gguf:
swin_norm (chameleon.swin_norm true). Both MHA 4 x 16, 2 layers, untied head, vocabulary 320 (no image range)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAMES = ("chameleon", "chameleon-swin")
BASE_ERR = 2e-6          # the fixtures' float32 misses (rel_err): 1.1e-6 and 1.1e-6


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


@pytest.mark.parametrize("name", NAMES)
def test_layout_read_from_the_file(name):
    m = engine(name).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab) == (16, 4, 4, 64, 96, 320)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 10000.0
    assert not c.tied_output and m.output is not m.token_embd
    assert m.swin_norm == (name == "chameleon-swin")
    assert not m.mask_image_tokens            # 320 < 8196: no image range in this vocabulary
    b = m.blocks[1]
    assert b.attn_q_norm.shape == (4, 16) and b.attn_k_norm.shape == (4, 16)
    assert b.attn_q_norm_b.shape == (4, 16) and b.attn_k_norm_b.shape == (4, 16)
    # the converter's rows: head 0's, repeated (conversion/chameleon.py _reverse_hf_permute)
    assert torch.equal(b.attn_q_norm, b.attn_q_norm[:1].expand(4, 16))


def _no_qk_norm(m):
    return lambda x, w, b: x


def _rms_not_layer_norm(m):
    def f(x, w, b):       # the mean kept
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w
        return (y + b).to(x.dtype)
    return f


def _no_qk_bias(m):
    real = m.head_layer_norm
    return lambda x, w, b: real(x, w, None)


def _norm_over_all_heads(m):
    def f(x, w, b):       # one LayerNorm over the whole projection (H * Dh), not per head
        T, G, Dh = x.shape
        xf = x.float().reshape(T, G * Dh)
        y = torch.nn.functional.layer_norm(xf, (G * Dh,), eps=1e-5).view(T, G, Dh)
        return (y * w + b).to(x.dtype)
    return f


@pytest.mark.parametrize("name,what", [
    ("chameleon", "no_qk_norm"), ("chameleon", "rms_not_layer_norm"), ("chameleon", "no_qk_bias"),
    ("chameleon", "norm_over_all_heads"), ("chameleon", "neox_rope"), ("chameleon", "swin_on"),
    ("chameleon-swin", "swin_off"), ("chameleon-swin", "no_qk_norm"), ("chameleon-swin", "no_qk_bias")])
def test_each_rule_is_needed(monkeypatch, name, what):
    """The per-head q/k LayerNorm (skipped, as RMSNorm, without its bias, over all heads at once), NORM rope (not
    NEOX pairs), and the file's swin_norm (each fixture run with the other placement of the norms)."""
    eng = engine(name)
    m = eng.model
    assert miss(eng, name) < 10 * BASE_ERR
    patch = {"no_qk_norm": _no_qk_norm, "rms_not_layer_norm": _rms_not_layer_norm, "no_qk_bias": _no_qk_bias,
             "norm_over_all_heads": _norm_over_all_heads}
    if what in patch:
        monkeypatch.setattr(m, "head_layer_norm", patch[what](m))
    elif what == "neox_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))     # (this engine's own cfg)
    else:
        monkeypatch.setattr(m, "swin_norm", what == "swin_on")
    err = miss(eng, name)
    assert err > 10 * TOL, (what, err)


def test_qk_norm_eps_is_fixed_not_the_files(tmp_path):
    """The q/k LayerNorms take eps 1e-5 whatever chameleon.attention.layer_norm_rms_epsilon says (load_arch_hparams:
    f_norm_eps = 1e-5; HF ChameleonLayerNorm: F.layer_norm(..., eps=1e-5)); the RMSNorms take the file's (0.5 here)."""
    from minfer.models import chameleon

    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf",
                set_keys={"chameleon.attention.layer_norm_rms_epsilon": (0.5, gguf.GGUFValueType.FLOAT32)})
    m = load(p)
    assert m.cfg.rms_eps == 0.5 and chameleon.QK_NORM_EPS == 1e-5
    seen = []
    real = chameleon.ops.layer_norm

    def spy(x, w, eps, out_dtype=None):
        seen.append(eps)
        return real(x, w, eps, out_dtype)

    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    chameleon.ops.layer_norm = spy
    try:
        m.forward(torch.tensor([5, 6, 7]), Step.at(0, 3, "cpu"), KVCache.for_config(m.cfg, 16))
    finally:
        chameleon.ops.layer_norm = real
    assert seen and set(seen) == {1e-5}


# ---- the image-token logits (llama.cpp src/models/chameleon.cpp: ids [4, 8196) set to -FLT_MAX) ----

V_BIG = 8200


def padded_file(tmp_path, name: str = "chameleon"):
    """The fixture with its vocabulary padded to 8200 rows (random embedding and head rows for ids 320..8199), so
    it holds the releases' image range 4..8195."""
    rd = gguf.GGUFReader(str(DATA / f"{name}.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    rng = np.random.default_rng(3)
    add = {}
    for n in ("token_embd.weight", "output.weight"):
        w = t[n]
        extra = (rng.standard_normal((V_BIG - w.shape[0], w.shape[1])) * 1.5 / 8).astype(np.float32)
        add[n] = np.concatenate([w, extra])
    return rewrite(DATA / f"{name}.gguf", tmp_path / "big.gguf", drop_tensors=tuple(add), add_tensors=add)


def _forward(m, ids):
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    return m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64))


@pytest.mark.parametrize("name", NAMES)
def test_image_tokens_suppressed_on_every_row(tmp_path, name):
    """A vocabulary holding ids 4..8195: those logits are -FLT_MAX (HF: finfo(float32).min, the same value) on every
    row; the others are the model's (ids 0-3 equal transformers' on the unpadded rows); with the mask off, ids
    0..319 give transformers' logits (the padding changes nothing else)."""
    r = ref(name)
    m = load(padded_file(tmp_path, name))
    assert m.cfg.vocab == V_BIG and m.mask_image_tokens
    got = _forward(m, r["ids"].tolist()).numpy()
    assert got.shape == (len(r["ids"]), V_BIG)
    assert (got[:, 4:8196] == np.finfo(np.float32).min).all()
    assert np.isfinite(got[:, 8196:]).all() and (got[:, 8196:] > -1e30).all()
    scale = np.abs(r["logits"]).max(-1, keepdims=True)
    assert (np.abs(got[:, :4] - r["logits"][:, :4]) / scale).max() < TOL
    m.mask_image_tokens = False
    plain = _forward(m, r["ids"].tolist()).numpy()
    assert rel_err(plain[:, :320], r["logits"]) < TOL
    allowed = np.r_[0:4, 8196:V_BIG]
    assert np.isin(got.argmax(-1), allowed).all()
    assert (got.argmax(-1) == allowed[plain[:, allowed].argmax(-1)]).all()


def test_image_tokens_never_generated(tmp_path):
    """Greedy decoding through the KV cache on the padded file: no id of 4..8195 comes out, and each step's token is
    the best of the others."""
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    m = load(padded_file(tmp_path))
    cache = KVCache.for_config(m.cfg, 64)
    toks = ref("chameleon")["prompt"].tolist()
    logits = m.forward(torch.tensor(toks), Step.at(0, len(toks), "cpu"), cache)[-1]
    out = []
    for _ in range(12):
        nxt = int(logits.argmax())
        out.append(nxt)
        logits = m.forward(torch.tensor([nxt]), Step.at(len(toks) + len(out) - 1, 1, "cpu"), cache)[-1]
    assert all(t < 4 or t >= 8196 for t in out), out


# ---- variants and refusals by name ----

def test_qk_norm_biases_are_optional(tmp_path):
    """No attn_q_norm.bias / attn_k_norm.bias (llama.cpp: TENSOR_NOT_REQUIRED): zero biases; the logits then move
    away from transformers' (the fixture's biases are not zero)."""
    drop = tuple(f"blk.{i}.attn_{qk}_norm.bias" for i in range(2) for qk in "qk")
    m = load(rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", drop_tensors=drop))
    assert m.blocks[0].attn_q_norm_b is None and m.blocks[1].attn_k_norm_b is None
    r = ref("chameleon")
    assert rel_err(_forward(m, r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


def test_missing_swin_key_is_pre_norm(tmp_path):
    """No chameleon.swin_norm key: false (llama.cpp get_key(LLM_KV_SWIN_NORM, swin_norm, false))."""
    p = rewrite(DATA / "chameleon-swin.gguf", tmp_path / "x.gguf", drop_keys=("chameleon.swin_norm",))
    assert load(p).swin_norm is False


def test_swin_key_of_another_type_is_refused(tmp_path):
    p = rewrite(DATA / "chameleon-swin.gguf", tmp_path / "x.gguf",
                set_keys={"chameleon.swin_norm": ("true", gguf.GGUFValueType.STRING)})
    with pytest.raises(MinferError, match=r"chameleon\.swin_norm' is 'true': expected a bool"):
        load(p)


def test_tied_head_without_output_tensor(tmp_path):
    """No output.weight: the embedding is the head (llama.cpp TENSOR_DUPLICATED)."""
    m = load(rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd


@pytest.mark.parametrize("tensor", ["blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.0.attn_norm.weight",
                                    "blk.1.ffn_norm.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight",
                                    "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["chameleon.attention.layer_norm_rms_epsilon", "chameleon.block_count",
                                 "chameleon.feed_forward_length", "chameleon.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor,shape", [("blk.1.attn_output.bias", 64), ("blk.0.ffn_up.bias", 96)])
def test_tensor_llama_cpp_does_not_take_is_refused(tmp_path, tensor, shape):
    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", add_tensors={tensor: np.zeros(shape, np.float32)})
    with pytest.raises(MinferError, match=rf"tensor '{tensor.replace('.', chr(92) + '.')}': chameleon has no such"):
        load(p)


def test_partial_rope_is_refused(tmp_path):
    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf",
                set_keys={"chameleon.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"chameleon\.rope\.dimension_count=8: chameleon rotates the whole head"):
        load(p)


def test_qk_norm_of_wrong_width_is_named(tmp_path):
    """A shared (Dh,) q norm (one row, not one per head) is not llama.cpp's (Dh, H): refused naming the tensor."""
    rd = gguf.GGUFReader(str(DATA / "chameleon.gguf"))
    row = next(np.asarray(t.data, dtype=np.float32) for t in rd.tensors if t.name == "blk.0.attn_q_norm.weight")[0]
    p = rewrite(DATA / "chameleon.gguf", tmp_path / "x.gguf", drop_tensors=("blk.0.attn_q_norm.weight",),
                add_tensors={"blk.0.attn_q_norm.weight": row})
    with pytest.raises(MinferError, match=r"blk\.0\.attn_q_norm\.weight"):
        load(p)
