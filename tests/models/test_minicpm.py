"""MiniCPM 1 / 2 / 4 (minfer/models/minicpm.py, arch `minicpm`) on the CPU's float32 reference, against two
references (transformers 5.25 has no MiniCPM class: remote code): the independent torch forward of the HF checkpoint
(tools/gen_minicpm_fixture.py reference(), float64) and llama.cpp's own logits and greedy ids (llama-cpp-python
0.3.36 on an F32 copy of the file). Checked: the logits at every position and the greedy continuation, the KV cache
in pieces, the batch engine's paged cache, each of the three scales needed (without one the logits miss by far), the
tied head, the scales' defaults when the keys are absent, LongRoPE as the converter writes it (rope.scaling.type
longrope and the two factor tensors: against the reference with each factor set and llama.cpp's logits of the
converted LongRoPE file at a context within and past the trained one), what is refused by name, and the CUDA
backend's code (Triton's interpreter on CPU tensors) in prefill and decode.
Fixture: tests/data/arch/minicpm.gguf (tools/gen_minicpm_fixture.py: hidden 64, 4 heads of 16, 2 kv heads, FFN 96,
2 layers, vocab 320, scale_emb 12, scale_depth 0.6 (residual_scale 0.424), dim_model_base 256 (logit_scale 0.25),
untied head; converted by llama.cpp's convert_hf_to_gguf.py, f16)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

NAME = "minicpm"
TIGHT = 1e-5           # float32 vs the float64 reference / llama.cpp's F32 graph: 6e-7 / 5.5e-7 measured


def miss(eng, key="logits") -> float:
    """The largest relative miss of eng's logits against the reference's r[key] (on as many ids as it has rows)."""
    r = ref(NAME)
    n = len(r[key])
    return rel_err(eng.logits(r["ids"][:n].tolist()).numpy(), r[key])


def test_layout_and_scales_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert c.arch == "minicpm" and type(m).__name__ == "MiniCPMModel"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 2)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 10000.0 and c.rope_long is None
    assert not c.tied_output
    assert m.embed_scale == 12.0 and m.logit_scale == 0.25 and m.q_scale == 1.0
    assert math.isclose(m.residual_scale, 0.6 / math.sqrt(2), rel_tol=1e-6)


def test_logits_match_reference_and_llama_cpp():
    r = ref(NAME)
    # the two references agree with each other (the fixture's own check)
    assert rel_err(r["lc_logits"], r["logits"]) < TIGHT
    eng = engine(NAME)
    got = eng.logits(r["ids"].tolist()).numpy()
    assert got.shape == r["logits"].shape == (40, 320)
    assert rel_err(got, r["logits"]) < TIGHT
    assert rel_err(got, r["lc_logits"]) < TIGHT


def test_greedy_matches_llama_cpp():
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 8        # not a repeated token
    eng = engine(NAME)
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                              max_new_tokens=len(r["greedy"]))]
    assert out == r["lc_greedy"].tolist()


def test_kv_cache_in_pieces_equals_one_pass():
    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    whole = eng.logits(ids).numpy()
    cuts = [0, 1, 5, 14, 15, 23, len(ids)]
    eng2 = engine(NAME)
    got = np.concatenate([eng2.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(got, r["logits"]) < TIGHT
    assert rel_err(got, whole) < TIGHT


def test_batch_engine_greedy():
    """Through the batch engine's paged cache (blocks of 4), next to a second sequence."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    eng = engine(NAME)
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    n = len(r["greedy"])
    other = r["ids"][10:25].tolist()
    outs = be.generate_many([r["prompt"].tolist(), other], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["lc_greedy"].tolist()
    single = [ev.token_id for ev in eng.generate(other, SamplingParams(temperature=0), max_new_tokens=n)]
    assert [ev.token_id for ev in outs[1]] == single


@pytest.mark.parametrize("what", ["embedding_scale", "residual_scale", "logit_scale", "neox_rope",
                                  "granite_attention_scale"])
def test_each_rule_is_needed(monkeypatch, what):
    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TIGHT
    if what == "embedding_scale":                # x_0 = E[tokens], not 12 E[tokens]
        monkeypatch.setattr(m, "embed_scale", 1.0)
    elif what == "residual_scale":               # each branch added unscaled
        monkeypatch.setattr(m, "residual_scale", 1.0)
    elif what == "logit_scale":                  # logits not divided by hidden / dim_model_base
        monkeypatch.setattr(m, "logit_scale", 1.0)
    elif what == "neox_rope":                    # NEOX instead of NORM (the converter permuted q/k for NORM)
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))      # (this engine's own cfg)
    else:                                        # the scores scaled by 1/D_h, not 1/sqrt(D_h)
        monkeypatch.setattr(m, "q_scale", 1.0 / math.sqrt(m.cfg.head_dim))
        monkeypatch.setattr(type(m), "_attention", type(m).__mro__[1]._attention)   # GraniteScales' (uses q_scale)
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


def test_tied_head(tmp_path):
    """Without output.weight the logits reuse token_embd (MiniCPM-2B's tie_word_embeddings): the reference's
    logits_tied, from lm_head = embed_tokens on the same weights."""
    from minfer.runtime.engine import Engine

    p = rewrite(DATA / "minicpm.gguf", tmp_path / "tied.gguf", drop_tensors=("output.weight",))
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert eng.config.tied_output
    assert miss(eng, "logits_tied") < TIGHT
    assert miss(eng) > 10 * TOL


def test_scale_defaults_when_keys_absent(tmp_path):
    """Older files without the three keys: scale_emb 12, 1.4 / sqrt(n_layer), logits / (n_embd / 256)
    (minicpm.cpp load_arch_hparams' defaults for the first two; the module doc for the third)."""
    import gguf

    keys = ("minicpm.embedding_scale", "minicpm.residual_scale", "minicpm.logit_scale")
    m = load(rewrite(DATA / "minicpm.gguf", tmp_path / "old.gguf", drop_keys=keys))
    assert m.embed_scale == 12.0 and m.logit_scale == 64 / 256
    assert math.isclose(m.residual_scale, 1.4 / math.sqrt(2), rel_tol=1e-12)
    F32 = gguf.GGUFValueType.FLOAT32
    m0 = load(rewrite(DATA / "minicpm.gguf", tmp_path / "zero.gguf",
                      set_keys={keys[0]: (0.0, F32), keys[1]: (0.0, F32)}))
    assert m0.embed_scale == 1.0 and m0.residual_scale == 1.0     # 0: not applied, as llama.cpp


@pytest.mark.parametrize("tensor", ["blk.0.attn_output.bias", "blk.1.ffn_down.bias", "blk.0.attn_q.bias"])
def test_bias_refused(tmp_path, tensor):
    shape = 96 if tensor.endswith("ffn_up.bias") else 64
    p = rewrite(DATA / "minicpm.gguf", tmp_path / "x.gguf", add_tensors={tensor: np.zeros(shape, np.float32)})
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key,value", [("minicpm.logit_scale", 0.0), ("minicpm.expert_count", 4),
                                       ("minicpm.rope.scaling.attn_factor", 1.5)])
def test_bad_keys_refused(tmp_path, key, value):
    import gguf

    vt = gguf.GGUFValueType.UINT32 if isinstance(value, int) else gguf.GGUFValueType.FLOAT32
    p = rewrite(DATA / "minicpm.gguf", tmp_path / "x.gguf", set_keys={key: (value, vt)})
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_missing_tensor_is_named(tmp_path):
    for t in ("blk.1.attn_k.weight", "blk.0.ffn_gate.weight", "output_norm.weight"):
        p = rewrite(DATA / "minicpm.gguf", tmp_path / "x.gguf", drop_tensors=(t,))
        with pytest.raises(MinferError, match=t.replace(".", r"\.")):
            load(p)


def longrope_file(tmp_path) -> Path:
    """The fixture as the converter writes a LongRoPE checkpoint (rope_scaling longrope): plus
    minicpm.rope.scaling.type longrope and rope_factors_short / rope_factors_long.weight (head_dim/2 each;
    gen_minicpm_fixture.check_longrope_file checked the converter's file is exactly that)."""
    import gguf

    r = ref(NAME)
    return rewrite(DATA / "minicpm.gguf", tmp_path / "lr.gguf",
                   set_keys={"minicpm.rope.scaling.type": ("longrope", gguf.GGUFValueType.STRING)},
                   add_tensors={"rope_factors_short.weight": r["lr_short"], "rope_factors_long.weight": r["lr_long"]})


def test_longrope_factors_chosen_by_context(tmp_path):
    """Short factors while the context fits context_length (256; the converter writes no original length), the long
    ones past it (llama_model::get_rope_factors): against the reference with each set (HF MiniCPMLongRoPE) and
    llama.cpp's logits on the converted LongRoPE file at n_ctx 64 and 512."""
    from minfer.runtime.engine import Engine

    p = longrope_file(tmp_path)
    short = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert short.config.rope_long is not None and short.config.rope.freq_scale == 1.0
    assert short.model.rope_for(short.cache) is short.config.rope
    assert miss(short, "logits_lr") < TIGHT and miss(short, "lc_logits_lr") < TIGHT
    long_ = Engine.load(p, ctx=512, progress=False, switches=reference_switches())
    assert long_.model.rope_for(long_.cache) is long_.config.rope_long
    assert miss(long_, "logits_lr_long") < TIGHT and miss(long_, "lc_logits_lr_long") < TIGHT
    # the factor sets matter: the wrong one, or none, misses by far
    assert miss(long_, "logits_lr") > 10 * TOL and miss(short, "logits_lr_long") > 10 * TOL
    r = ref(NAME)
    assert rel_err(r["logits_lr"], r["logits"][:len(r["logits_lr"])]) > 10 * TOL


def test_longrope_pieces_and_batch_engine(tmp_path):
    """The LongRoPE file through the KV cache in pieces and the batch engine's paged cache (its n_ctx picks the
    factors: 64, the short ones)."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    eng = Engine.load(longrope_file(tmp_path), ctx=64, progress=False, switches=reference_switches())
    ids = r["ids"][:len(r["logits_lr"])].tolist()
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in ((0, 5), (5, 6), (6, len(ids)))])
    assert rel_err(got, r["logits_lr"]) < TIGHT
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    prompt = r["prompt"].tolist()
    want = [ev.token_id for ev in eng.generate(prompt, SamplingParams(temperature=0), max_new_tokens=8)]
    outs = be.generate_many([prompt, ids[3:12]], SamplingParams(temperature=0), 8)
    assert [ev.token_id for ev in outs[0]] == want


def test_longrope_type_refused_elsewhere(tmp_path):
    """rope.scaling.type longrope stays refused for an architecture without `longrope_factors` (llama here)."""
    import gguf

    p = rewrite(DATA / "llama3.gguf", tmp_path / "x.gguf",
                set_keys={"llama.rope.scaling.type": ("longrope", gguf.GGUFValueType.STRING)})
    with pytest.raises(MinferError, match="'longrope' is not supported"):
        load(p)


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
