"""Mistral 3 / Ministral 3 (minfer/models/mistral3.py) against transformers, on the CPU's float32
reference: the logits at every position, the greedy continuation, the KV cache in pieces and through
the batch engine's paged cache; each rule of the graph needed (with one changed the logits miss by
more than 10x the tolerance); what the model does not run refused by name; and the CUDA backend's
code (Triton's interpreter) past the original context, where the attention temperature applies.
Fixture: tests/data/arch/mistral3.gguf (tools/gen_arch_fixtures.py: transformers'
Ministral3ForCausalLM with YaRN factor 8 over an original 16, mscale_all_dim 0.5, Llama-4 scaling
beta 0.5, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
import math
import os
import sys

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "mistral3"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_values_read_from_the_file():
    """YaRN's factor, beta and original context, mscale_all_dim and the temperature's beta, as the
    fixture's HF config has them; c = get_mscale(8, 1) / get_mscale(8, 0.5)."""
    m = engine(NAME).model
    hf = json.loads((DATA / "mistral3.json").read_text())["config"]["rope_parameters"]
    assert m.temp_beta == pytest.approx(hf["llama_4_scaling_beta"]) and m.temp_len == hf["original_max_position_embeddings"]
    c = (1 + 0.1 * math.log(8)) / (1 + 0.05 * math.log(8))
    assert m.q_scale == pytest.approx(c * c, rel=1e-6)
    # ggml_rope_yarn_corr_dims: the ramp of beta 32 / 1 over 16 positions, floored/ceiled: pairs 0..2
    assert m.rope.freq_factors[0] == 1.0 and m.rope.freq_factors[2:] == (8.0,) * 10
    assert 1.0 < m.rope.freq_factors[1] < 8.0
    t = m.temperature(torch.tensor([0, 15, 16, 31, 32, 39]))
    want = [1 + 0.5 * math.log(1 + p // 16) for p in (0, 15, 16, 31, 32, 39)]
    assert t.tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("what", ["yarn", "yarn_untruncated", "mscale", "temperature", "adjacent_pairs"])
def test_each_rule_is_needed(what):
    from dataclasses import replace

    from minfer.gguf_file import GGUFFile
    from minfer.models.gpt_oss import yarn_rope

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "yarn":                  # the plain rope of rope.freq_base
        m.rope = m.cfg.rope
    elif what == "yarn_untruncated":    # HF gpt-oss's fractional correction dims instead of ggml's rounded ones
        m.rope = yarn_rope(GGUFFile(DATA / "mistral3.gguf"), NAME, m.cfg.rope, truncate=False)[0]
    elif what == "mscale":
        m.q_scale = 1.0
    elif what == "temperature":
        m.temp_beta = 0.0
    elif what == "adjacent_pairs":      # the halves rotated (NEOX) instead of adjacent pairs (NORM)
        m.rope = replace(m.rope, style="neox")
    assert miss(eng) > 10 * TOL


def test_without_yarn_and_temperature_it_is_llama(tmp_path):
    """A file without rope.scaling.type and attention.temperature_scale (Mistral Small 3.1's) runs
    Llama's attention path with the plain rope; on this fixture's weights that misses transformers'."""
    p = rewrite(DATA / "mistral3.gguf", tmp_path / "x.gguf",
                drop_keys=("mistral3.rope.scaling.type", "mistral3.attention.temperature_scale"))
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    m = eng.model
    assert m.rope is m.cfg.rope and m.q_scale == 1.0 and m.temp_beta == 0.0
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("key", ["mistral3.rope.scaling.original_context_length", "mistral3.rope.scaling.factor",
                                 "mistral3.attention.layer_norm_rms_epsilon", "mistral3.block_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "mistral3.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_temperature_without_original_context_is_named(tmp_path):
    """llama.cpp would fall back to context_length; HF has no such default: refused, the key named."""
    key = "mistral3.rope.scaling.original_context_length"
    p = rewrite(DATA / "mistral3.gguf", tmp_path / "x.gguf", drop_keys=("mistral3.rope.scaling.type", key))
    with pytest.raises(MinferError, match=key.replace(".", r"\.") + ".*temperature"):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.1.attn_q.weight", "blk.0.ffn_norm.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "mistral3.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("kind,arg", [
    ("tensor", ("blk.0.attn_output.bias", np.zeros(64))), ("tensor", ("blk.0.ffn_down.bias", np.zeros(64))),
    ("key", ("mistral3.expert_count", (8, gguf.GGUFValueType.UINT32))),
    ("key", ("mistral3.rope.scaling.yarn_attn_factor", (2.0, gguf.GGUFValueType.FLOAT32)))])
def test_what_it_does_not_run_is_refused_by_name(tmp_path, kind, arg):
    name, value = arg
    kw = {"add_tensors": {name: value}} if kind == "tensor" else {"set_keys": {name: value}}
    p = rewrite(DATA / "mistral3.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=name.replace(".", r"\.")):
        load(p)


def test_yarn_refused_for_other_architectures(tmp_path):
    """config.py lets yarn through for mistral3 (its class applies it), not for llama."""
    p = rewrite(DATA / "mistral.gguf", tmp_path / "x.gguf",
                set_keys={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING),
                          "llama.rope.scaling.factor": (8.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match="rope.scaling.type 'yarn'"):
        load(p)


# ---- the CUDA backend's code (Triton's interpreter) past the original context ------------------

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm", "minfer.ops.cuda"]


@pytest.fixture(scope="module")
def cuda_ops():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "ops"))
    from kernel_data import interpreted_modules

    yield from interpreted_modules(_MODS)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_cuda_backend_past_the_original_context(cuda_ops, monkeypatch):
    """A 20-token prefill (positions 16-19 at temperature 1.35) and host-free decode steps at
    positions 20 and 33 (1.35, 1.55) through the CUDA backend's code: within 1e-5 of the reference
    (tests/ops/test_arch_forward_interpreted.py's 10 tokens stay below 16, at temperature 1)."""
    from kernel_data import route_to_cuda

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / "mistral3.gguf"), progress=False)
    toks = torch.arange(3, 23) * 7 % 300 + 3
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, 64)
    ref_pre = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    ref_dec = [m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)]
    ref_dec.append(m.forward(torch.tensor([9]), Step.at(33, 1, "cpu"), ref_cache))

    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    cache = KVCache.for_config(m.cfg, 64)
    pre = m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
    dec = [m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)]
    dec.append(m.forward(torch.tensor([9]), Step(torch.tensor([33]), None, "all"), cache, ctx))

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(pre, ref_pre) < 1e-5
    assert all(rel(a, b) < 1e-5 for a, b in zip(dec, ref_dec))
    assert "rope.triton" in paths.snapshot()["counts"]
