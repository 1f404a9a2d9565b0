"""SmallThinker (minfer/models/smallthinker.py, GGUF arch `smallthinker`) on the CPU's float32 reference, against two
references that minfer made neither of: a torch forward of the HF checkpoint written from the SmallThinker
architecture (tools/gen_smallthinker_fixture.py reference(): the router on the layer's input, sigmoid top-2 weights
renormalized, ReGLU experts, rotate_half rope on the rope_layout layers only, a 4096-key window on the
sliding_window_layout layers), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV
cache). transformers 5.25 has no SmallThinker class (remote code only), so test_arch_vs_transformers does not list
it; this file runs its checks here: logits at the first and last 24 of 4224 positions (past llama.cpp's fixed
4096-token window), greedy continuation (llama.cpp's), the KV cache in pieces across the window, the batch engine's
paged cache; each rule of the graph needed (with one changed the logits miss by more than 10x the tolerance); the
loader's refusals; the layer kinds without a window (SmallThinker-4BA0.6B's layout); and the CUDA backend's code
through Triton's interpreter.

Fixture: tests/data/arch/smallthinker.{gguf,npz,json} (tools/gen_smallthinker_fixture.py build + goldens): hidden 32,
2 heads of 16 over 1 kv head, 3 layers (0: global, no rope; 1, 2: window, rope), 8 experts of width 32, top-2,
sigmoid gating, vocab 320, tied output, converted by llama.cpp's convert_hf_to_gguf.py (conversion/smallthinker.py).

Tolerances: minfer misses the float64 torch forward by 2.7e-6 on the first 24 positions and 1.5e-5 on the last 24
(float32 over 4224 positions); llama.cpp misses it by 2.6e-6 and 2.4e-4 there: its rope angles at positions past
4000 are float32 (ggml's rope cache multiplies theta by theta_scale in float32, one pair after another; the reference
with its angles made that way meets llama.cpp's late rows to 1.2e-5, checked when the fixture was made), so the
llama.cpp comparison of the late rows is looser.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, load, ref, rel_err, rewrite

NAME = "smallthinker"
EARLY, LATE = 24, 24
REF_ERR = (5e-6, 3e-5)      # vs the torch forward: the first / the last 24 rows
LC_ERR = (5e-6, 5e-4)       # vs llama.cpp
CTX = 4352


def engine():
    from models.test_arch_vs_transformers import reference_switches
    from minfer.runtime.engine import Engine

    return Engine.load(DATA / f"{NAME}.gguf", ctx=CTX, progress=False, switches=reference_switches())


def ids_rows():
    """ids_long and the rows compared: its first 24 positions (the fixture's ids) and its last 24 (rows_long)."""
    r = ref(NAME)
    return r["ids_long"].astype(np.int64).tolist(), np.concatenate([np.arange(EARLY), r["rows_long"].astype(np.int64)])


def wanted(key: str) -> np.ndarray:
    """A reference's logits at ids_rows()' rows: `key` (the first 24) then `key`_long (the last 24)."""
    r = ref(NAME)
    return np.concatenate([r[key], r[key + "_long"]])


def logits_at_rows(eng) -> np.ndarray:
    ids, rows = ids_rows()
    return eng.logits(ids).numpy()[rows]


def misses(got: np.ndarray, key: str) -> tuple[float, float]:
    want = wanted(key)
    return rel_err(got[:EARLY], want[:EARLY]), rel_err(got[EARLY:], want[EARLY:])


@pytest.fixture(scope="module")
def eng():
    return engine()


@pytest.fixture(scope="module")
def got(eng):
    return logits_at_rows(eng)


def test_layout_read_from_the_file(eng):
    from minfer.models.smallthinker import SmallThinkerModel

    m, c = eng.model, eng.model.cfg
    assert type(m) is SmallThinkerModel and c.arch == "smallthinker"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.vocab, c.n_layers) == (16, 2, 1, 32, 320, 3)
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_gating) == (8, 2, 32, "sigmoid")
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.theta == 10000.0
    assert c.tied_output and m.output is m.token_embd
    assert m.is_local == (False, True, True) and m.use_rope == (False, True, True) and m.window == 4096
    hf = json.loads((DATA / f"{NAME}.json").read_text())["config"]
    assert hf["architectures"] == ["SmallThinkerForCausalLM"]
    assert hf["sliding_window_layout"] == [0, 1, 1] and hf["rope_layout"] == [0, 1, 1]
    r = ref(NAME)
    assert len(r["ids_long"]) > 4096 + 64 and r["rows_long"].min() > 4096 + 64   # their window drops 64+ keys
    assert r["ids"].tolist() == r["ids_long"][:EARLY].tolist()


def test_the_two_references_agree():
    """The fixture's own check: the torch forward of the HF checkpoint and llama.cpp on the converted file."""
    r = ref(NAME)
    early, late = misses(wanted("lc_logits"), "logits")
    assert early < LC_ERR[0] and late < LC_ERR[1]
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


@pytest.mark.parametrize("key,tol", [("logits", REF_ERR), ("lc_logits", LC_ERR)])
def test_logits_match_both_references(got, key, tol):
    want = wanted(key)
    assert got.shape == want.shape
    early, late = misses(got, key)
    assert early < tol[0] and late < tol[1]
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_greedy_matches_llamacpp(eng):
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    n = len(r["lc_greedy"])
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0), max_new_tokens=n)]
    assert out == r["lc_greedy"].tolist()


def test_cache_in_pieces_equals_one_pass(got):
    """Pieces of 1 to 2900 tokens, some ending inside the first window and some past it (each piece's queries then
    see keys from the pieces before, cut at 4096 back)."""
    ids, rows = ids_rows()
    e = engine()
    cuts = [0, 1, 2, 7, 24, 1000, 3900, 4097, 4098, 4150, len(ids)]
    out = np.concatenate([e.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])[rows]
    assert rel_err(out, got) < 1e-5
    early, late = misses(out, "lc_logits")
    assert early < LC_ERR[0] and late < LC_ERR[1]


def test_batch_engine_greedy_matches_llamacpp(eng):
    """The batch engine's paged cache (blocks of 4), next to a second sequence."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    n = len(r["lc_greedy"])
    other = r["ids"][10:25].astype(np.int64).tolist()
    outs = be.generate_many([r["prompt"].tolist(), other], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["lc_greedy"].tolist()
    single = [ev.token_id for ev in eng.generate(other, SamplingParams(temperature=0), max_new_tokens=n)]
    assert [ev.token_id for ev in outs[1]] == single


@pytest.mark.parametrize("what", ["router_after_norm", "router_after_attention", "softmax", "swiglu", "no_window",
                                  "window_from_file", "rope_everywhere", "no_renorm"])
def test_each_rule_is_needed(monkeypatch, what):
    """The router on the layer's input (not the FFN-normed stream nor the residual after attention), sigmoid gating
    (not softmax), ReGLU experts (not SwiGLU), the 4096 window on layers 1 and 2 (not none; not the file's own
    sliding_window key, rewritten here to 64 — llama.cpp ignores it), NoPE on layer 0, the top-k renormalized."""
    import minfer.models.smallthinker as st
    from minfer import ops

    e = engine()
    m = e.model
    if what == "router_after_norm":
        monkeypatch.setattr(m, "ffn_routed", lambda h, r, blk, ctx, f=m.ffn_routed: f(h, h, blk, ctx))
    elif what == "router_after_attention":
        orig = ops.add_rms_norm
        seen = {}

        def spy(x, y, w, eps, dt, ctx=None, into_linear=False):
            s, h = orig(x, y, w, eps, dt, ctx, into_linear)
            seen["s"] = s
            return s, h
        monkeypatch.setattr(ops, "add_rms_norm", spy)
        monkeypatch.setattr(m, "ffn_routed", lambda h, r, blk, ctx, f=m.ffn_routed: f(h, seen["s"], blk, ctx))
    elif what == "softmax":
        object.__setattr__(m.cfg, "expert_gating", "softmax")
    elif what == "swiglu":
        monkeypatch.setattr(st, "EXPERT_ACT", "silu")
    elif what == "no_window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "window_from_file":
        monkeypatch.setattr(m, "window", 64)
    elif what == "rope_everywhere":
        monkeypatch.setattr(m, "use_rope", (True,) * 3)
    else:
        orig_moe = ops.moe_ffn
        monkeypatch.setattr(ops, "moe_ffn", lambda *a, **k: orig_moe(*a[:6], False, *a[7:], **k))
    out = logits_at_rows(e)
    for key in ("logits", "lc_logits"):
        assert max(misses(out, key)) > 10 * TOL, (what, key, misses(out, key))


def test_refusals(tmp_path):
    """What llama.cpp's graph lacks or its loader never reads, refused by name rather than run wrongly."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match="expert_gating_func"):
        load(rewrite(src, tmp_path / "a.gguf", drop_keys=(f"{NAME}.expert_gating_func",)))
    with pytest.raises(MinferError, match="expert_weights_scale"):
        load(rewrite(src, tmp_path / "b.gguf",
                     set_keys={f"{NAME}.expert_weights_scale": (2.0, gguf.GGUFValueType.FLOAT32)}))
    with pytest.raises(MinferError, match="expert_feed_forward_length"):
        load(rewrite(src, tmp_path / "c.gguf", drop_keys=(f"{NAME}.expert_feed_forward_length",)))
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "d.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match=r"blk\.2\.ffn_gate_inp\.weight"):
        load(rewrite(src, tmp_path / "e.gguf", drop_tensors=("blk.2.ffn_gate_inp.weight",)))


def test_layer_kinds_without_a_window(tmp_path):
    """Without `attention.sliding_window` (SmallThinker-4BA0.6B: no sliding_window_layout entry set, so the converter
    writes none) every layer is global and rotated (smallthinker.cpp: swa_type NONE, n_no_rope_layer_step =
    n_layer); with a window every 4th layer from 0 is global and unrotated; `rope.freq_base_swa`, when a file has it,
    is the window layers' base (get_rope_freq_base)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models.smallthinker import layer_kinds

    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "a.gguf", drop_keys=(f"{NAME}.attention.sliding_window",)))
    assert m.is_local == (False,) * 3 and m.use_rope == (True,) * 3 and m.window == 0

    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "b.gguf",
                     set_keys={f"{NAME}.rope.freq_base_swa": (500.0, gguf.GGUFValueType.FLOAT32)}))
    assert m.rope_swa.theta == 500.0 and m.cfg.rope.theta == 10000.0 and m.rope_swa.style == "neox"

    class Cfg:
        arch, n_layers, sliding_window = NAME, 9, 4096
    loc, rope = layer_kinds(GGUFFile(DATA / f"{NAME}.gguf"), Cfg)
    assert loc == rope == tuple(i % 4 != 0 for i in range(9))


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
