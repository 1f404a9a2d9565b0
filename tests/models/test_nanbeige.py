"""Nanbeige4.2 (minfer/models/nanbeige.py, GGUF arch `nanbeige`) on the CPU's float32 reference, against two
references that minfer made neither of: a torch forward of the HF checkpoint written from the architecture
(tools/gen_nanbeige_fixture.py reference(): llama's layer, the physical layers run num_loops times over shared
weights, the final norm between loops), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the
file, F32 KV cache). transformers 5.25 has no Nanbeige class (remote code only), so this file runs the checks:
logits at every position (also with skip_loop_final_norm set), greedy continuation (llama.cpp's), the KV cache in
pieces, the batch engine's paged cache; each rule of the graph needed (with one changed the logits miss by more
than 10x the tolerance); the loader's refusals; and the CUDA backend's code through Triton's interpreter.

Fixture: tests/data/arch/nanbeige.{gguf,npz,json} (tools/gen_nanbeige_fixture.py build + goldens): hidden 64, 4
heads of 16 over 2 kv heads, FFN 96, 2 physical layers x num_loops 2 (4 cache slots), vocab 320, rope base 7e4,
untied output, converted by llama.cpp's convert_hf_to_gguf.py (conversion/nanbeige.py NanbeigeModel).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations


import gguf
import numpy as np
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "nanbeige"
BASE_ERR = 1e-5      # the fixture's float32 misses: 6.3e-6 (reference), 5.5e-6 (llama.cpp); they agree to 2.6e-6


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.nanbeige import NanbeigeModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is NanbeigeModel and c.arch == NAME
    # block_count 2 physical layers, num_loops 2: 4 cache slots, slot i + 2 j the same Block as slot i
    assert (m.n_phys, m.n_loops, m.loop_norm, c.n_layers) == (2, 2, True, 4)
    assert m.blocks[2] is m.blocks[0] and m.blocks[3] is m.blocks[1] and m.blocks[0] is not m.blocks[1]
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab) == (16, 4, 2, 64, 96, 320)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 7e4 and c.rope.freq_factors is None
    assert not c.tied_output and m.output is not m.token_embd
    assert len(m.qweights()) == 2 + 2 * 7 and len(m.linear_groups()) == 2 and len(m.decode_groups()) == 4
    assert NanbeigeModel.block_passes(eng_file()) == {0: 2, 1: 2}
    from minfer.commands.preflight import cache_config, kv_bytes_per_token

    assert cache_config(eng_file()).n_layers == 4          # the preflight sizes the 4 slots' KV
    assert kv_bytes_per_token(cache_config(eng_file()), "cpu") == 4 * 2 * 2 * 16 * 4


def eng_file():
    from minfer.gguf_file import GGUFFile

    return GGUFFile(DATA / f"{NAME}.gguf")


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert rel_err(r["lc_logits_skip"], r["logits_skip"]) < BASE_ERR
    assert rel_err(r["logits_skip"], r["logits"]) > 10 * TOL      # the loop norm matters on this fixture
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


def test_skip_loop_final_norm_key(tmp_path):
    """nanbeige.skip_loop_final_norm true: no output norm between the loops, as both references."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "skip.gguf",
                set_keys={f"{NAME}.skip_loop_final_norm": (True, gguf.GGUFValueType.BOOL)})
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert not eng.model.loop_norm
    assert miss(eng, "logits_skip") < BASE_ERR and miss(eng, "lc_logits_skip") < BASE_ERR


def pieces(eng, ids):
    cuts = [0, 1, 2, 5, 14, 15, 23, len(ids)]
    return np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])


@pytest.mark.parametrize("what", ["one_loop", "no_loop_norm", "neox", "base"])
def test_each_rule_is_needed(monkeypatch, what):
    """The second loop over the shared layers, the output norm between loops, NORM rope on the permuted rows (not
    NEOX halves), the file's rope base (not llama.cpp's default 1e4)."""
    from dataclasses import replace

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "one_loop":
        monkeypatch.setattr(m, "blocks", m.blocks[:m.n_phys])
    elif what == "no_loop_norm":
        monkeypatch.setattr(m, "loop_norm", False)
    elif what == "neox":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    else:
        object.__setattr__(c, "rope", replace(c.rope, theta=10000.0))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_each_pass_has_its_own_cache_slot(monkeypatch):
    """The second loop's keys in slots 2, 3 (not over the first loop's in 0, 1): one pass cannot tell (each
    layer attends what it has just written), the cache in pieces can."""
    from minfer.models.llama import LlamaModel

    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    m = eng.model
    orig = LlamaModel.attention_residual_norm

    def shared(self, h, blk, i, *a):
        return orig(self, h, blk, i % self.n_phys, *a)

    monkeypatch.setattr(type(m), "attention_residual_norm", shared)
    assert miss(eng) < BASE_ERR
    assert rel_err(pieces(engine(NAME), ids), r["lc_logits"]) > 10 * TOL


def test_refusals(tmp_path):
    """A num_loops below 1 (nanbeige.cpp asserts n_loops >= 1), a non-bool skip key, and tensors the converter
    never writes (biases, a fused attn_qkv), refused by name rather than run wrongly."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match="num_loops"):
        load(rewrite(src, tmp_path / "a.gguf", set_keys={f"{NAME}.num_loops": (0, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match="skip_loop_final_norm"):
        load(rewrite(src, tmp_path / "b.gguf",
                     set_keys={f"{NAME}.skip_loop_final_norm": (1, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k\.bias"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.1.attn_k.bias": np.zeros(32)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "d.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64))}))


def test_one_loop_file_is_llama(tmp_path):
    """Without the num_loops key (default 1) the graph is llama's on the same weights: the llama arch's logits."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    r = ref(NAME)
    a = rewrite(DATA / f"{NAME}.gguf", tmp_path / "n.gguf", drop_keys=(f"{NAME}.num_loops",))
    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    keys = [k for k in rd.fields if k.startswith(f"{NAME}.") and "loop" not in k]
    b = rewrite(DATA / f"{NAME}.gguf", tmp_path / "l.gguf", arch="llama", drop_keys=keys,
                set_keys={"llama." + k.split(".", 1)[1]: (rd.fields[k].contents(), rd.fields[k].types[0]) for k in keys})
    got = [Engine.load(p, ctx=64, progress=False, switches=reference_switches()).logits(r["ids"].tolist()).numpy()
           for p in (a, b)]
    assert got[0].shape == got[1].shape
    assert rel_err(got[0], got[1]) < 1e-6


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
