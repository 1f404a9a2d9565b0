"""PLaMo-13B (minfer/models/plamo.py, GGUF arch `plamo`) on the CPU's float32 reference, against two references that
minfer made neither of: a torch forward of the HF checkpoint written from the architecture (tools/gen_plamo_fixture.py
reference(): one RMSNorm feeding attention and MLP in parallel, rotate_half rope, HF's TILED kv-head sharing on the
unshuffled checkpoint), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache).
transformers 5.25 has no PLaMo class (remote code only), so this file runs the model's own checks: its layout, each
rule of the graph needed (with one changed the logits miss both references by more than 10x the tolerance), the
loader's refusals.

Fixture: tests/data/arch/plamo.{gguf,npz,json} (tools/gen_plamo_fixture.py build + goldens): hidden 48, 6 heads of 8,
n_shared_head 3 (2 kv heads), FFN 64, 2 layers, vocab 320, an untied lm_head, converted by llama.cpp's
convert_hf_to_gguf.py (conversion/plamo.py PlamoModel, its q / o head shuffle generalized from the 13B's shape).

The checks every llama.cpp-checked decoder shares (logits against both references at every position, greedy, the
cache in pieces, the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this
fixture; the CUDA backend's code through Triton's interpreter in tests/ops/test_arch_forward_interpreted.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "plamo"
BASE_ERR = 2e-6      # the fixture's float32 misses: see test_logits_match_both_references
H, KV, DH, D = 6, 2, 8, 48
SHARED = H // KV


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def reference_engine(path):
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    return Engine.load(path, ctx=64, progress=False, switches=reference_switches())


def test_layout_read_from_the_file():
    from minfer.models.plamo import PlamoModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is PlamoModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (DH, H, KV, D, 64, 320, 2)
    assert c.rope.style == "neox" and c.rope.n_rot == DH and c.rope.theta == 1e4 and c.rope.freq_factors is None
    assert c.rms_eps == pytest.approx(1e-6) and c.context_length == 4096
    assert not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]
    assert b.ffn_norm is None and b.attn_q_bias is None and b.attn_q_norm is None
    assert tuple(b.attn_q.shape) == (H * DH, D) and tuple(b.attn_k.shape) == (KV * DH, D)


def test_logits_match_both_references():
    """At every position (the shared checks in test_llamacpp_decoders.py do the same; measured here)."""
    r = ref(NAME)
    got = engine(NAME).logits(r["ids"].tolist()).numpy()
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR          # the two references agree (3.6e-7)
    assert rel_err(got, r["logits"]) < BASE_ERR                     # 7.1e-7
    assert rel_err(got, r["lc_logits"]) < BASE_ERR                  # 6.8e-7
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 8          # not a degenerate continuation


def sequential_forward(m):
    """Llama's sequential block on PLaMo's weights: the MLP reads attn_norm(x + attn) instead of attn_norm(x)."""
    from minfer import ops
    from minfer.models.layers import attention_branch, ffn_branch

    c = m.cfg

    def forward(tokens, step, cache, ctx=None):
        x = ops.embedding(tokens, m.token_embd)
        for i, blk in enumerate(m.blocks):
            x = x + attention_branch(ops.rms_norm(x, blk.attn_norm, c.rms_eps), blk, c, cache, i, step, ctx)
            x = x + ffn_branch(ops.rms_norm(x, blk.attn_norm, c.rms_eps), blk, ctx)
        return m.head(ops.rms_norm(step.rows(x), m.output_norm, c.rms_eps), ctx)

    return forward


@pytest.mark.parametrize("what", ["sequential", "normal_rope", "base"])
def test_each_rule_is_needed(monkeypatch, what):
    """The parallel block (both branches read one norm of x), NEOX rope on the file's rows (not NORM's adjacent
    pairs), the default rope base 10000 (the converter writes none)."""
    from dataclasses import replace

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "sequential":
        monkeypatch.setattr(m, "forward", sequential_forward(m))
    elif what == "normal_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="normal"))     # (this engine's own cfg)
    else:
        object.__setattr__(c, "rope", replace(c.rope, theta=1e6))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def heads_reordered(tmp_path, name: str, perm: list[int]) -> "object":
    """A copy of the fixture whose query head p is the file's head perm[p] (attn_q's rows and attn_output's columns
    moved together, every layer), loaded on the reference path."""
    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    idx = np.concatenate([np.arange(h * DH, (h + 1) * DH) for h in perm])
    add = {}
    for t in rd.tensors:
        if t.name.endswith(("attn_q.weight", "attn_output.weight")):
            w = np.asarray(t.data, dtype=np.float32).reshape([int(s) for s in reversed(t.shape)])   # (rows, cols)
            add[t.name] = w[idx] if t.name.endswith("attn_q.weight") else w[:, idx]
    return reference_engine(rewrite(DATA / f"{NAME}.gguf", tmp_path / name, drop_tensors=tuple(add),
                                    add_tensors=add))


def test_kv_groups_are_llamas_on_the_converted_heads(tmp_path):
    """The file's query head j reads kv head j // (H / KV): llama.cpp's grouping, which the converter's head shuffle
    (conversion/plamo.py shuffle_attn_q_weight / shuffle_attn_output_weight) makes equal HF's tiled sharing (head j
    reads kv j % KV) on the checkpoint. HF's tiled rule applied to the file's heads -- query head p read as the
    file's head (p % SHARED) * KV + p // SHARED, so that its kv head p // SHARED is that head's j % KV -- misses
    both references; a reorder that keeps each head in its group (the control) changes nothing."""
    tiled = [(p % SHARED) * KV + p // SHARED for p in range(H)]
    assert sorted(tiled) == list(range(H)) and tiled != list(range(H))
    assert all(p // SHARED == tiled[p] % KV for p in range(H))
    eng = heads_reordered(tmp_path, "tiled.gguf", tiled)
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL
    within = [g * SHARED + (s + 1) % SHARED for g in range(KV) for s in range(SHARED)]   # rotated inside each group
    eng = heads_reordered(tmp_path, "within.gguf", within)
    assert miss(eng) < BASE_ERR and miss(eng, "lc_logits") < BASE_ERR


def test_refusals(tmp_path):
    """Partial rope (plamo.cpp asserts n_embd_head == n_rot), tensors the converter never writes (q/k/v biases, a
    fused attn_qkv, an ffn_norm the parallel block has no use for, rope_freqs its graph never applies) refused by
    name; a missing output.weight (llama.cpp's loader requires it: no tied fallback) named."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "a.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (4, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k\.bias"):
        load(rewrite(src, tmp_path / "b.gguf", add_tensors={"blk.1.attn_k.bias": np.zeros(KV * DH)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((80, D))}))
    with pytest.raises(MinferError, match=r"blk\.0\.ffn_norm\.weight"):
        load(rewrite(src, tmp_path / "d.gguf", add_tensors={"blk.0.ffn_norm.weight": np.ones(D)}))
    with pytest.raises(MinferError, match=r"output\.weight"):
        load(rewrite(src, tmp_path / "e.gguf", drop_tensors=("output.weight",)))
    with pytest.raises(MinferError, match=r"rope_freqs\.weight"):
        load(rewrite(src, tmp_path / "f.gguf", add_tensors={"rope_freqs.weight": np.ones(DH // 2)}))
