"""rope.scaling.type yarn through the normal load path (no patch of minfer/config.py): accepted
for gpt-oss, whose model applies YaRN itself (the released gpt-oss files carry yarn, factor 32,
original context 4096), and still refused by name for llama and qwen2 files, which must not load
and silently run without it. Expected logits: transformers (tests/data/arch/gpt-oss-yarn.npz)."""

from __future__ import annotations

import math

import pytest

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from models.test_arch_vs_transformers import DATA, TOL, engine, ref, rel_err
from models.test_config import _rewrite
from models.tiny import TinySpec, write_tiny_model

YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 4096.0}


def test_gpt_oss_yarn_file_loads_and_matches_transformers():
    cfg = ModelConfig.from_gguf(GGUFFile(DATA / "gpt-oss-yarn.gguf"))
    assert cfg.rope.freq_scale == 1.0          # YaRN is the model's, not a linear scale
    r = ref("gpt-oss-yarn")
    eng = engine("gpt-oss-yarn")
    assert eng.model.q_scale == pytest.approx((1 + 0.1 * math.log(32)) ** 2)
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) < TOL


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_yarn_refused_for_other_architectures(tmp_path, arch):
    tiny = write_tiny_model(tmp_path / "t.gguf", TinySpec(arch=arch))
    ModelConfig.from_gguf(GGUFFile(tiny))      # the file itself loads without the yarn keys
    p = _rewrite(tiny, tmp_path / "y.gguf", set_={f"{arch}.{k}": v for k, v in YARN.items()})
    with pytest.raises(MinferError, match=rf"y\.gguf: {arch}\.rope\.scaling\.type 'yarn' is not supported"
                                          r".*yarn only for (\w+, )*deepseek2, (\w+, )*gpt-oss"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_gpt_oss_other_scaling_types_still_refused(tmp_path):
    p = _rewrite(DATA / "gpt-oss-yarn.gguf", tmp_path / "l.gguf", set_={"gpt-oss.rope.scaling.type": "longrope"})
    with pytest.raises(MinferError, match="'longrope' is not supported"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_gpt_oss_is_batched_by_serve_and_the_batch_engine():
    # the paged KV cache applies the sinks now (runtime/paged_kv.py; tests/runtime/test_paged_sinks.py):
    # serve keeps the -np asked for gpt-oss, with no warning, and the batch engine takes it
    from minfer.commands.serve import _one_at_a_time_if_unpaged
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    gf = GGUFFile(DATA / "gpt-oss.gguf")
    said = []
    assert _one_at_a_time_if_unpaged(gf, None, 0, said.append) == 0
    assert _one_at_a_time_if_unpaged(gf, 4, 4, said.append) == 4
    assert said == []
    eng = engine("gpt-oss")
    be = BatchEngine.from_engine(eng, max_seqs=2)
    outs = be.generate_many([[5, 77, 12, 140, 9], [11, 42, 7]], SamplingParams(temperature=0), 4)
    assert [len(o) for o in outs] == [4, 4]
