"""The Gluon q8 GEMV's shape rule (gemv_q8g_table.shape_rule), checked without a GPU: the real
models' decode shapes (from the synth presets' geometries) each get the config of their role,
one the kernel's launch-time checks accept (gemv_q8_gluon.launch: prefetch 2 only for splits of
at most two steps, warps along K with 16 chunks a warp, the residual q8 epilogue with 32-row tiles
dividing N; gemv_q8_gluon.supported's tiles); the shipped table's own shapes keep their configs;
the switch and a table file turn the rule off; the planes of the tile-major roles are laid out so."""

from __future__ import annotations

import json

import pytest
import torch

from minfer.bench.presets import get_preset
from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda import gemv_q8g_table as T
from minfer.ops.cuda.gemv_q8_fields import extras, kwarps, x_ahead
from minfer.ops.cuda.gemv_repack import splits
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked
from minfer.switches import Switches

PRESETS = ["qwen2.5-1.5b", "llama3.1-8b", "qwen3-8b", "glm4-9b", "gemma3-4b", "olmo2-7b", "granite-3.3-8b",
           "smollm3-3b", "gemma2-2b"]


def roles(name: str) -> dict:
    """role -> (N, K) of a preset's decode GEMVs (q/k/v and gate+up stacked, as the engine launches them)."""
    p = get_preset(name)
    q, kv = p.n_head * p.head_dim, p.n_kv_head * p.head_dim
    return {"qkv": (q + 2 * kv, p.hidden), "o": (p.hidden, q), "gate_up": (2 * p.ffn, p.hidden),
            "down": (p.hidden, p.ffn), "head": (p.vocab, p.hidden)}


def _role_of(cfg) -> str:
    """Which of the four configs this is (their tiles differ)."""
    return {(32, 2): "down", (32, 16): "o", (8, 8): "qkv", (8, 16): "qkv", (32, 1): "gate_up"}[tuple(cfg[:2])]


def _launch_checks(cfg, n: int, k: int) -> None:
    """The checks gemv_q8_gluon.launch makes at run time, for this config at this shape."""
    bn, bb, split, nw = cfg[:4]
    prefetch, regs, _ = extras(cfg)
    nb = k // 256
    bps, split = splits(nb, split, bb)
    assert GL.supported((Repacked(Q4_K, n, k, (torch.zeros(1),)),), bn, bb) is None
    assert not (prefetch == 2 and bps > 2 * bb), (cfg, n, k, bps)
    assert not (kwarps(cfg) and bb * 8 < 16 * nw), cfg
    assert n % bn == 0 and bn % 32 in (0, 8, 16, 24)
    assert 1 <= split <= nb and bps * (split - 1) < nb               # no empty split


@pytest.mark.parametrize("name", PRESETS)
def test_each_role_gets_its_config(name):
    for role, (n, k) in roles(name).items():
        for qt in (Q4_K, Q6_K):
            cfg = GL.config_for(qt, n, k, T.RULE)
            if n % 32 or k % 256:              # granite's vocab 49159; glm4's FFN 13696 (no K-quant blocks)
                assert cfg is None, (name, role, n, k)
                continue
            assert cfg is not None, (name, role, n, k)
            want = {"head": "gate_up"}.get(role, role)
            if role == "o" and n > k:
                want = "qkv"                   # gemma's o (2560 x 2048, 2304 x 2048): wider than its K, q/k/v's tiles
            assert _role_of(cfg) == want, (name, role, n, k, cfg)
            _launch_checks(cfg, n, k)


def test_the_rule_keeps_the_7b_programs_and_sizes_steps_to_k():
    # the 7B's down: its table config has 9 / 5 splits; the rule gives the same at that shape
    assert T.shape_rule(True, 3584, 18944)[2] == 9 and T.shape_rule(False, 3584, 18944)[2] == 5
    assert T.shape_rule(True, 3584, 18944)[5] == 72 and T.shape_rule(False, 3584, 18944)[5] == 0
    # llama3.1-8b's down (4096 x 14336): 128 tiles, 8 splits of 7 blocks (Q4_K); 4 of 14 (Q6_K)
    assert T.shape_rule(True, 4096, 14336)[2] == 8 and T.shape_rule(False, 4096, 14336)[2] == 4
    # the 1.5B's down (1536 x 8960): 48 tiles; 21 splits wanted, capped at 35 // 2 = 17 (2-block splits)
    assert T.shape_rule(True, 1536, 8960)[2] == 17
    # q/k/v: both steps before the PDL wait up to K = 4096 (two 8-block steps), 16-block steps after
    assert T.shape_rule(True, 6144, 4096)[:5] == (8, 8, 1, 4, 2)
    assert T.shape_rule(True, 7168, 5120)[:5] == (8, 16, 1, 4, 1)
    # gate+up and the down: tile-major planes with the q8 row loaded a step ahead
    for cfg in (T.shape_rule(True, 28672, 4096), T.shape_rule(True, 4096, 14336)):
        assert cfg[9] and x_ahead(cfg)
    # small or odd shapes keep the Triton kernel
    for n, k in ((896, 4864), (1000, 3584), (1536, 768), (1030, 2048), (2048, 1000)):
        assert T.shape_rule(True, n, k) is None, (n, k)


def test_shipped_shapes_are_the_table_and_the_switch_turns_the_rule_on(tmp_path):
    for key, cfg in GL.CONFIGS.items():
        qt = Q4_K if key.startswith("Q4_K") else Q6_K
        n, k = map(int, key.split()[1].split("x"))
        assert GL.config_for(qt, n, k) == tuple(cfg)
        assert GL.config_for(qt, n, k, T.RULE) == tuple(cfg)
    assert GL.config_for(Q4_K, 6144, 4096, T.RULE) is not None
    assert GL.config_for(Q4_K, 6144, 4096) is None
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"configs": {"Q4_K 3584x3584": [16, 8, 3, 4, False]}}))
    assert GL.config_for(Q4_K, 6144, 4096, str(f)) is None                 # a table file: its shapes only
    assert T.table_arg(Switches()) == T.RULE                               # on by default (perf-log AW2)
    assert T.table_arg(Switches.from_env({"MINFER_GEMV_Q8G_RULE": "0"})) == ""
    assert T.table_arg(Switches.from_env({"MINFER_GEMV_Q8G_RULE": "1"})) == T.RULE
    assert T.table_arg(Switches(gemv_q8g_rule=True, gemv_q8g_table=str(f))) == str(f)


def test_plane_layout_follows_the_rule(monkeypatch):
    from minfer.ops.cuda import plane_layout as PL

    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    on, off = Switches(gemv_q8g_rule=True), Switches(gemv_q8g_rule=False)
    down = Repacked(Q4_K, 4096, 14336, (torch.zeros(1),))
    qkv = Repacked(Q4_K, 6144, 4096, (torch.zeros(1),))
    assert PL.wanted(down, on, "cuda") == 32 and PL.wanted(down, off, "cuda") == 0
    assert PL.wanted(qkv, on, "cuda") == 0 == PL.wanted(qkv, off, "cuda")
    assert PL.wanted(down, Switches(gemv_q8g_rule=True, gemv_tiles=False), "cuda") == 0
