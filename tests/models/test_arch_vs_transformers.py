"""Every architecture against Hugging Face transformers (float32), on the CPU.

The fixtures in tests/data/arch/ come from tools/gen_arch_fixtures.py: tiny random HF models of
each architecture, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py (llama-cpp-python
0.3.36 source archive), with transformers 5.24's logits at every position and its greedy
continuation. Nothing here is produced by minfer. Pass: logits within 1e-3 (max |diff| / max
|ref| at each position) at every position, greedy tokens identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
ARCHS = ["qwen3", "llama3", "mistral", "gemma", "gemma3", "phi2", "phi3", "phi3partial", "qwen3moe", "qwen2moe", "gemma2", "granite",
         "granitemoe", "granitemoeshared", "smollm3", "ernie4_5", "glm4", "glm4moe", "olmo2", "olmo3", "gpt-oss",
         "command-r", "command-r-qknorm", "cohere2", "deepseek2", "deepseek3", "mistral3", "seed_oss", "exaone4",
         "starcoder2",
         "falcon", "falcon-40b", "falcon-11b", "starcoder", "gptneox", "gptneox-seq", "gpt2", "bloom", "mpt",
         "olmoe", "hunyuan-dense",
         "arcee", "apertus", "dots1", "hunyuan-moe", "minimax-m2",
         "qwen2vl", "qwen3vl", "qwen3vlmoe", "ernie4_5-moe", "ernie4_5-moe-step2", "exaone",
         "gemma4", "gemma4-ple", "gemma4-moe", "gemma3n", "lfm2", "lfm2moe", "llama4", "mamba", "falcon-mamba", "mamba2", "jamba",
         "qwen35", "qwen35moe", "qwen3next",
         "granitehybrid", "granitehybrid-dense", "nemotron_h", "falcon-h1", "falcon-h1-nonorm",
         "nemotron_h_moe", "nemotron_h_moe-latent", "olmo",
         "stablelm", "stablelm-12b", "nemotron", "nemotron-bias", "phimoe", "dbrx", "exaone-moe", "minicpm3", "afmoe", "jais2",
         "cohere2moe", "cohere2moe-ln",
         "granite_swa", "granitemoe_swa",
         "internlm3", "internlm3-bias",
         "olmo3-yarn",
         "hy_v3", "mellum", "mimo_v2_flash", "laguna", "laguna-elem", "laguna-yarn",
         "mellum-yarn",
         "bitnet", "bitnet-silu",
         "mistral4", "chatglm", "mixtral",
         "glm4moe-lite", "solar-open", "kimi-linear",
         "chameleon", "chameleon-swin",
         "muse-glimmer", "hrm-text",
         "gptj"]
EXPECT_ARCH = {"qwen3": "qwen3", "llama3": "llama", "mistral": "llama", "gemma": "gemma", "gemma3": "gemma3", "phi2": "phi2", "phi3": "phi3", "phi3partial": "phi3",
               "qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "gemma2": "gemma2", "granite": "granite", "granitemoe": "granitemoe", "granitemoeshared": "granitemoe", "smollm3": "smollm3", "ernie4_5": "ernie4_5", "glm4": "glm4", "glm4moe": "glm4moe", "olmo2": "olmo2",
               "olmo3": "olmo2", "gpt-oss": "gpt-oss",   # llama.cpp's converter writes OLMo 3 as olmo2 with a window pattern
               "command-r": "command-r", "command-r-qknorm": "command-r", "cohere2": "cohere2",
               "deepseek2": "deepseek2", "deepseek3": "deepseek2",   # V3 converts to deepseek2 too
               "mistral3": "mistral3", "seed_oss": "seed_oss", "exaone4": "exaone4",
               "starcoder2": "starcoder2",
               "falcon": "falcon", "falcon-40b": "falcon", "falcon-11b": "falcon", "starcoder": "starcoder",
               "gptneox": "gptneox", "gptneox-seq": "gptneox", "gpt2": "gpt2", "bloom": "bloom", "mpt": "mpt",
               "olmoe": "olmoe", "hunyuan-dense": "hunyuan-dense",
               "arcee": "arcee", "apertus": "apertus", "dots1": "dots1", "hunyuan-moe": "hunyuan-moe",
               "minimax-m2": "minimax-m2",
               "qwen2vl": "qwen2vl", "qwen3vl": "qwen3vl", "qwen3vlmoe": "qwen3vlmoe",
               "ernie4_5-moe": "ernie4_5-moe", "ernie4_5-moe-step2": "ernie4_5-moe", "exaone": "exaone",
               "gemma4": "gemma4", "gemma4-ple": "gemma4", "gemma4-moe": "gemma4", "gemma3n": "gemma3n", "lfm2": "lfm2", "lfm2moe": "lfm2moe", "llama4": "llama4", "mamba": "mamba", "falcon-mamba": "mamba", "mamba2": "mamba2", "jamba": "jamba",
               "qwen35": "qwen35", "qwen35moe": "qwen35moe", "qwen3next": "qwen3next",
               "granitehybrid": "granitehybrid", "granitehybrid-dense": "granitehybrid", "nemotron_h": "nemotron_h",
               "falcon-h1": "falcon-h1", "falcon-h1-nonorm": "falcon-h1",
               "nemotron_h_moe": "nemotron_h_moe", "nemotron_h_moe-latent": "nemotron_h_moe", "olmo": "olmo",
               "stablelm": "stablelm", "stablelm-12b": "stablelm",
               "nemotron": "nemotron", "nemotron-bias": "nemotron", "phimoe": "phimoe", "dbrx": "dbrx", "exaone-moe": "exaone-moe",
               "minicpm3": "minicpm3", "afmoe": "afmoe", "jais2": "jais2",
               "cohere2moe": "cohere2moe", "cohere2moe-ln": "cohere2moe",
               "granite_swa": "granite_swa", "granitemoe_swa": "granite_swa",
               "internlm3": "llama", "internlm3-bias": "llama", "olmo3-yarn": "olmo2",   # conversion/internlm.py InternLM3Model writes llama
               "hy_v3": "hy_v3", "mellum": "mellum", "mimo_v2_flash": "mimo2",   # conversion/mimo.py writes mimo2
               "laguna": "laguna", "laguna-elem": "laguna", "laguna-yarn": "laguna",
               "mellum-yarn": "mellum",
               "mistral4": "mistral4", "chatglm": "chatglm",
               "mixtral": "llama"}   # conversion/__init__.py: "MixtralForCausalLM": "llama"
EXPECT_ARCH |= {"bitnet": "bitnet", "bitnet-silu": "bitnet"}   # conversion/bitnet.py BitnetModel
# GLM-4.7-Flash: conversion/glm.py Glm4MoeLiteModel(DeepseekV2Model) writes deepseek2; Solar Open: SolarOpenModel(Glm4MoeModel)
EXPECT_ARCH |= {"glm4moe-lite": "deepseek2", "solar-open": "glm4moe"}
EXPECT_ARCH |= {"kimi-linear": "kimi-linear"}   # conversion/kimi_linear.py KimiLinearModel
EXPECT_ARCH |= {"chameleon": "chameleon", "chameleon-swin": "chameleon"}   # conversion/chameleon.py ChameleonModel
EXPECT_ARCH |= {"hrm-text": "hrm_text"}   # conversion/hrm_text.py HrmTextModel
EXPECT_ARCH |= {"muse-glimmer": "muse-glimmer"}   # conversion/muse_glimmer.py MuseGlimmerModel
EXPECT_ARCH |= {"gptj": "gptj"}   # tools/gptj_fixture.py (llama.cpp's converter has no GPT-J class)
# phi3's fixture: original context 32, so a context of 32 keeps the short rope factors
# (what transformers used for its 24-token reference) and 64 switches to the long ones
CTX = {"phi3": 32, "phi3partial": 32}
CTX |= {"minicpm3": 32}   # minicpm3: LongRoPE, the original context 32 as phi3's
TOL = 1e-3
# test_arch_incremental_equals_whole's inner cuts where the default [5, 14] misses the feature
CUTS = {"mistral3": [5, 14, 17, 33], "exaone4": [5, 14, 23], "exaone-moe": [5, 14, 23], "afmoe": [5, 14, 23],
        "cohere2moe": [5, 14, 23], "cohere2moe-ln": [5, 14, 23], "gemma4": [5, 14, 23], "gemma4-ple": [5, 14, 23],
        "granite_swa": [5, 14, 23], "granitemoe_swa": [5, 14, 23], "mellum": [5, 14, 23], "mimo_v2_flash": [5, 14, 23],
        "laguna": [5, 14, 23], "laguna-yarn": [5, 14, 23], "mellum-yarn": [5, 14, 23],
        "gemma4-moe": [5, 14, 23], "gemma3n": [5, 14, 23],
        # lfm2: pieces of 1, 2 and 3 tokens, so a conv window (3 taps) reaches back over 1 or 2 earlier pieces
        "lfm2": [1, 2, 4, 5, 14, 15, 23], "lfm2moe": [1, 2, 4, 5, 14, 15, 23],
        # mamba2: pieces of 1-3 tokens inside the conv window (4 taps), the SSM state carried
        "mamba2": [1, 2, 4, 5, 14, 15, 23],
        # mamba / falcon-mamba: pieces of 1-3 tokens inside the conv window (4 taps), a piece of 18 across a scan
        # chunk boundary (16), the state carried
        "mamba": [1, 2, 4, 5, 23, 24, 26], "falcon-mamba": [1, 2, 4, 5, 23, 24, 26],
        # jamba: mamba's cuts (the Mamba-1 conv window and a scan chunk crossed; the attention layers' rows)
        "jamba": [1, 2, 4, 5, 23, 24, 26],
        # granitehybrid: pieces of 1-3 tokens inside the conv window (4 taps: the ring reaches back over 1-3 earlier
        # pieces) and the SSM state carried from piece to piece (a piece of 26 crosses no chunk; 66 tokens in
        # test_granitehybrid.py do)
        # qwen35: pieces of 1-3 tokens inside the DeltaNet conv window (4 taps), the delta-rule state carried
        "qwen35": [1, 2, 4, 5, 14, 15, 23], "qwen35moe": [1, 2, 4, 5, 14, 15, 23],
        "qwen3next": [1, 2, 4, 5, 14, 15, 23],
        "granitehybrid": [1, 2, 4, 5, 14, 15, 23], "granitehybrid-dense": [1, 2, 4, 5, 14, 15, 23],
        "nemotron_h": [1, 2, 4, 5, 14, 15, 23], "falcon-h1": [1, 2, 4, 5, 14, 15, 23],
        "falcon-h1-nonorm": [1, 2, 4, 5, 14, 15, 23],
        "nemotron_h_moe": [1, 2, 4, 5, 14, 15, 23], "nemotron_h_moe-latent": [1, 2, 4, 5, 14, 15, 23],
        # kimi-linear: pieces of 1-3 tokens inside the KDA convs' window (4 taps), the per-channel delta-rule state
        # carried, the MLA layers' latent rows
        "kimi-linear": [1, 2, 4, 5, 14, 15, 23],
        "muse-glimmer": [5, 14, 23],   # pieces across the window of 8
        # hrm-text: pieces of 1-3 tokens, every pass of the two stacks reading back its own cache slots
        "hrm-text": [1, 2, 4, 5, 14, 15, 23]}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest, over positions, of max |got - ref| / max |ref| at that position."""
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def reference_switches():
    """The float32 reference path on the CPU: any CPU fast path that changes numerics off."""
    import os

    from minfer.switches import Switches

    return Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})


def engine(name: str, ctx: int | None = None):
    from minfer.runtime.engine import Engine

    return Engine.load(DATA / f"{name}.gguf", ctx=ctx or CTX.get(name, 64), progress=False,
                       switches=reference_switches())


def ref(name: str):
    return np.load(DATA / f"{name}.npz")


@pytest.mark.parametrize("name", ARCHS)
def test_arch_logits_match_transformers(name):
    r = ref(name)
    eng = engine(name)
    assert eng.config.arch == EXPECT_ARCH[name]
    got = eng.logits(r["ids"].tolist()).numpy()
    assert got.shape == r["logits"].shape
    err = rel_err(got, r["logits"])
    assert err < TOL, f"{name}: max relative logit error {err:.2e}"
    assert (got.argmax(-1) == r["logits"].argmax(-1)).all()


@pytest.mark.parametrize("name", ARCHS)
def test_arch_greedy_matches_transformers(name):
    from minfer.runtime.sampling import SamplingParams

    r = ref(name)
    eng = engine(name)
    n = len(r["greedy"])
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0), max_new_tokens=n)]
    assert out == r["greedy"].tolist()


@pytest.mark.parametrize("name", ["gemma", "gemma3", "qwen3moe", "qwen2moe", "phi2", "phi3", "gemma2", "olmo3", "granite", "smollm3", "granitemoeshared", "glm4", "glm4moe",
                                  "gpt-oss", "command-r-qknorm", "cohere2", "deepseek2", "deepseek3", "mistral3",
                                  "starcoder2",
                                  "falcon", "falcon-40b", "falcon-11b", "starcoder", "gptneox", "gptneox-seq", "gpt2", "bloom", "mpt",
                                  "olmoe", "hunyuan-dense",
                                  "arcee", "apertus", "dots1", "hunyuan-moe", "minimax-m2",
                                  "qwen2vl", "qwen3vl", "qwen3vlmoe", "ernie4_5-moe", "ernie4_5-moe-step2", "exaone",
                                  "seed_oss", "exaone4", "gemma4", "gemma4-ple", "gemma4-moe", "gemma3n", "lfm2", "lfm2moe", "llama4", "mamba", "falcon-mamba", "mamba2", "jamba",
                                  "qwen35", "qwen35moe", "qwen3next",
                                  "granitehybrid", "granitehybrid-dense", "nemotron_h", "falcon-h1",
                                  "falcon-h1-nonorm", "nemotron_h_moe", "nemotron_h_moe-latent", "olmo",
                                  "stablelm", "stablelm-12b", "nemotron", "nemotron-bias", "phimoe", "dbrx", "exaone-moe", "minicpm3", "afmoe", "jais2",
                                  "cohere2moe", "cohere2moe-ln",
                                  "granite_swa", "granitemoe_swa",
                                  "internlm3", "internlm3-bias",
                                  "olmo3-yarn",
                                  "hy_v3", "mellum", "mimo_v2_flash", "laguna", "laguna-elem",
                                  "laguna-yarn", "mellum-yarn",
                                  "bitnet", "bitnet-silu",
                                  "mistral4", "chatglm", "mixtral",
                                  "glm4moe-lite", "solar-open", "kimi-linear",
                                  "chameleon", "chameleon-swin",
                                  "muse-glimmer", "hrm-text",
                                  "gptj"])
def test_arch_incremental_equals_whole(name):
    """The same sequence in pieces through the KV cache (gemma3 and the others with a window of 8:
    pieces that straddle it; mistral3: its original context of 16, the temperature's first step;
    gemma4-ple: the shared layers read what the producers wrote in earlier pieces) gives
    transformers' logits too."""
    r = ref(name)
    ids = r["ids"].tolist()
    eng = engine(name)
    cuts = [0] + CUTS.get(name, [5, 14]) + [len(ids)]
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(got, r["logits"]) < TOL


@pytest.mark.parametrize("name", ["phi3", "phi3partial"])
def test_phi3_long_rope_factors_past_original_context(name):
    """A context past phi3.rope.scaling.original_context_length takes rope_factors_long (as
    llama.cpp does); transformers took them for its 48-token sequence. phi3partial rotates 12
    of 16 dims per head (Phi-4-mini's partial_rotary_factor 0.75)."""
    r = ref(name)
    eng = engine(name, ctx=64)
    got = eng.logits(r["ids_long"].tolist()).numpy()
    assert rel_err(got, r["logits_long"]) < TOL
    short = engine(name, ctx=32).logits(r["ids"].tolist()).numpy()
    assert rel_err(short, r["logits"]) < TOL
    # and the two factor sets differ enough that picking the wrong one would fail
    wrong = engine(name, ctx=64).logits(r["ids"].tolist()).numpy()
    assert rel_err(wrong, r["logits"]) > 10 * TOL


def test_gemma3_layer_pattern_and_local_rope():
    """Five sliding-window layers then a global one (llama.cpp's default pattern 6); the local
    layers rotate with rope.freq_base_swa (20000 in the fixture), the global with freq_base."""
    m = engine("gemma3").model
    assert m.is_local == (True, True, True, True, True, False)
    assert m.window == 8
    assert [r.theta for r in m.layer_rope] == [20000.0] * 5 + [1000000.0]


@pytest.mark.parametrize("name", ["gemma", "phi2", "gemma2", "olmo3", "mistral3", "exaone4", "gemma4", "gemma4-ple", "gemma3n", "gpt-oss", "lfm2", "lfm2moe", "llama4",
                                  "deepseek2", "deepseek3", "granitehybrid", "granitehybrid-dense", "nemotron_h",
                                  "falcon-h1", "falcon-h1-nonorm", "qwen35", "qwen35moe", "qwen3next", "mamba", "falcon-mamba", "jamba",
                                  "nemotron_h_moe", "nemotron_h_moe-latent", "olmo",
                                  "stablelm", "stablelm-12b", "nemotron", "nemotron-bias", "phimoe", "dbrx", "exaone-moe", "minicpm3", "afmoe", "jais2",
                                  "cohere2moe", "cohere2moe-ln",
                                  "granite_swa", "granitemoe_swa",
                                  "internlm3", "internlm3-bias",
                                  "olmo3-yarn",
                                  "hy_v3", "mellum", "mimo_v2_flash", "laguna", "laguna-elem",
                                  "laguna-yarn", "mellum-yarn",
                                  "bitnet", "bitnet-silu",
                                  "mistral4", "chatglm", "mixtral",
                                  "glm4moe-lite", "solar-open", "kimi-linear",
                                  "chameleon", "chameleon-swin",
                                  "muse-glimmer", "hrm-text",
                                  "gptj"])
def test_batch_engine_greedy_matches_transformers(name):
    """Through the batch engine's paged cache (blocks of 4, so the window of 8 spans blocks; the
    soft-cap and window by paged_kv's torch references; mistral3's YaRN rope and per-position
    temperature; gemma4's per-layer cache geometry; gpt-oss's sinks; lfm2's conv rows read back through
    the block tables, across blocks; deepseek2's latent rows with V a view of K and its own scale; the
    Mamba-2 hybrids' and the Qwen3.5 family's gated DeltaNet per-sequence state slots,
    runtime/paged_state.py; llama4 through attend(chunk=) at its released chunk 8192, which these lengths never
    cross: tests/runtime/test_paged_chunked.py serves it at chunk 8), next to a second sequence."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    r = ref(name)
    eng = engine(name)
    # n_ctx: minicpm3's LongRoPE factors are chosen by it (CTX: the short ones, transformers' for these lengths)
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=CTX.get(name, 64), max_seqs=2, n_blocks=40, block_size=4)
    n = len(r["greedy"])
    other = r["ids"][10:25].tolist()
    outs = be.generate_many([r["prompt"].tolist(), other], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["greedy"].tolist()
    single = [ev.token_id for ev in eng.generate(other, SamplingParams(temperature=0), max_new_tokens=n)]
    assert [ev.token_id for ev in outs[1]] == single


def test_gemma2_layer_pattern_and_caps():
    """Local layers 0 and 2, global 1 and 3 (llama.cpp load_swa_pattern(ml, 2); HF layer_types),
    the fixture's window and soft-caps read from the GGUF, one rope base for all layers."""
    m = engine("gemma2").model
    assert m.is_local == (True, False, True, False)
    assert m.window == 8
    assert (m.attn_softcap, m.final_softcap) == (3.0, 10.0)
    assert [r.theta for r in m.layer_rope] == [10000.0] * 4


def test_smollm3_nope_layers(monkeypatch):
    """Every fourth layer attends without rope (llama.cpp's fixed step; HF's default no_rope_layers,
    which the fixture's config records), and with rope on that layer too the logits miss transformers'."""
    import json

    eng = engine("smollm3")
    hf = json.loads((DATA / "smollm3.json").read_text())["config"]["no_rope_layers"]
    assert eng.model.use_rope == tuple(bool(v) for v in hf) == (True, True, True, False)
    r = ref("smollm3")
    monkeypatch.setattr(type(eng.model), "use_rope", property(lambda self: (True,) * 4))
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


def test_ernie4_5_rotates_adjacent_pairs():
    """ERNIE 4.5 rotates adjacent pairs (llama.cpp NORM; HF's interleaved rotate_half) on q/k the
    converter leaves as they are: with the halves rotated instead (NEOX) the logits miss transformers'."""
    from dataclasses import replace

    r = ref("ernie4_5")
    eng = engine("ernie4_5")
    assert eng.config.rope.style == "normal"
    object.__setattr__(eng.model.cfg, "rope", replace(eng.model.cfg.rope, style="neox"))   # (this engine's own cfg)
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


@pytest.mark.parametrize("what", ["full_rotation", "up_gate_order", "no_post_norms"])
def test_glm4_each_rule_is_needed(monkeypatch, what):
    """GLM-4's partial rotation (half of each head), its fused [gate; up] order and its post-norms:
    with any one changed the logits miss transformers' by far."""
    from dataclasses import replace

    import torch

    r = ref("glm4")
    eng = engine("glm4")
    m = eng.model
    assert m.cfg.rope.n_rot == m.cfg.head_dim // 2
    if what == "full_rotation":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))    # (this engine's own cfg)
    elif what == "up_gate_order":
        F = m.cfg.ffn
        for b in m.blocks:     # the reference path multiplies by the dense weight
            monkeypatch.setattr(b.ffn_up, "dense", torch.cat([b.ffn_up.dense[F:], b.ffn_up.dense[:F]]))
    else:
        from minfer import ops

        real = ops.rms_norm
        post = {id(v) for b in m.blocks for v in (b.post_attention_norm, b.post_ffw_norm)}
        monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps, *a: x if id(w) in post else real(x, w, eps, *a))
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


def test_olmo3_layer_pattern():
    """OLMo 3's per-layer pattern (three local, one global) from olmo2.attention.sliding_window_pattern."""
    m = engine("olmo3").model
    assert m.is_local == (True, True, True, False) and m.window == 8
    assert engine("olmo2").model.is_local == (False, False)


@pytest.mark.parametrize("what", ["attn_softcap", "final_softcap", "window"])
def test_gemma2_each_rule_is_needed(monkeypatch, what):
    """Without its attention soft-cap, its final soft-cap or its sliding window, the gemma2
    fixture misses transformers' logits by far: the fixture tests each rule."""
    r = ref("gemma2")
    eng = engine("gemma2")
    big = {"attn_softcap": 1e30, "final_softcap": 1e30, "window": 0}[what]   # cap 1e30: tanh is the identity
    monkeypatch.setattr(eng.model, what, big)
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got, r["logits"]) > 50 * TOL


def test_olmo2_norms_are_whole_projection():
    """A per-head q/k norm (the qwen3 reading) is not what llama.cpp/transformers do: with the
    norm applied per head the logits miss the reference."""
    import torch

    from minfer import ops

    r = ref("olmo2")
    eng = engine("olmo2")
    m = eng.model
    real = ops.rms_norm

    def per_head(x, w, eps, *a):
        if w.shape[0] == x.shape[-1] and w is m.blocks[0].attn_q_norm:
            H, Dh = m.cfg.n_heads, m.cfg.head_dim
            y = real(x.reshape(-1, Dh), torch.ones(Dh), eps).reshape(x.shape)
            return y * w
        return real(x, w, eps, *a)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(ops, "rms_norm", per_head)
    try:
        got = eng.logits(r["ids"].tolist()).numpy()
    finally:
        monkeypatch.undo()
    assert rel_err(got, r["logits"]) > 10 * TOL


# ---- bad input: a clear MinferError naming the architecture or the key ----------------------

def rewrite(src: Path, dst: Path, arch: str | None = None, drop_keys=(), drop_tensors=(), set_keys=None,
            add_tensors=None) -> Path:
    """A copy of a GGUF with another architecture name, without some keys/tensors, with some keys set
    (name -> (value, GGUFValueType)) or extra float32 tensors (name -> array), written by the gguf
    package (llama.cpp's reader and writer)."""
    import gguf

    set_keys = set_keys or {}
    rd = gguf.GGUFReader(str(src))
    old_arch = rd.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch or old_arch)
    for name, f in rd.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys or name in set_keys:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)
    for name, (value, vtype) in set_keys.items():
        w.add_key_value(name, value, vtype)
    for t in rd.tensors:
        if t.name in drop_tensors:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    for name, arr in (add_tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def load(path):
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model

    return load_model(GGUFFile(path), progress=False)


def test_unsupported_architecture_is_named(tmp_path):
    p = rewrite(DATA / "qwen3.gguf", tmp_path / "x.gguf", arch="rwkv6")
    with pytest.raises(MinferError, match="architecture 'rwkv6' is not supported"):
        load(p)


@pytest.mark.parametrize("name,key", [("qwen3moe", "qwen3moe.expert_count"),
                                      ("qwen3moe", "qwen3moe.expert_feed_forward_length"),
                                      ("gemma3", "gemma3.attention.layer_norm_rms_epsilon"),
                                      ("phi3", "phi3.block_count"), ("granitemoe", "granitemoe.expert_used_count"),
                                      ("glm4", "glm4.attention.layer_norm_rms_epsilon"),
                                      ("glm4moe", "glm4moe.expert_shared_count"),
                                      ("command-r", "command-r.attention.layer_norm_epsilon"),
                                      ("cohere2", "cohere2.logit_scale"), ("cohere2", "cohere2.attention.sliding_window"),
                                      ("deepseek2", "deepseek2.attention.kv_lora_rank"),
                                      ("deepseek3", "deepseek2.expert_count")])
def test_missing_key_is_named(tmp_path, name, key):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("name,tensor", [("gemma3", "blk.1.post_ffw_norm.weight"),
                                         ("gemma2", "blk.2.post_attention_norm.weight"),
                                         ("olmo2", "blk.1.attn_k_norm.weight"),
                                         ("phi3", "rope_factors_long.weight"),
                                         ("qwen3moe", "blk.0.ffn_gate_inp.weight"),
                                         ("glm4", "blk.1.post_ffw_norm.weight"), ("glm4", "blk.0.attn_k.bias"),
                                         ("glm4moe", "blk.1.exp_probs_b.bias"), ("glm4moe", "blk.0.ffn_gate.weight"),
                                         ("glm4moe", "blk.2.ffn_down_shexp.weight"),
                                         ("granitemoeshared", "blk.1.ffn_up_shexp.weight"),
                                         ("granite", "blk.0.ffn_gate.weight"), ("smollm3", "blk.3.attn_k.weight"),
                                         ("ernie4_5", "blk.1.ffn_down.weight"),
                                         ("command-r-qknorm", "blk.1.attn_k_norm.weight"),
                                         ("command-r", "blk.1.attn_norm.weight"), ("cohere2", "blk.3.ffn_gate.weight"),
                                         ("deepseek2", "blk.2.attn_k_b.weight"), ("deepseek2", "blk.0.ffn_gate.weight"),
                                         ("deepseek2", "blk.1.ffn_up_shexp.weight"),
                                         ("deepseek3", "blk.1.attn_q_a_norm.weight"), ("deepseek3", "blk.2.attn_kv_a_norm.weight")])
def test_missing_tensor_is_named(tmp_path, name, tensor):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)
