"""Checks shared by the per-architecture tests (test_<arch>.py) on the fixtures of tests/data/arch: a rewritten
file refused by name, the CPU's default (int8/int4) path against transformers' logits, and dropping one group of
biases of a LayerNorm / biased-linear model (starcoder2, starcoder, gpt2, gptneox, bloom) for its rule-is-needed
test; for the MoE / sliding-window models (afmoe, hy_v3, laguna, mellum, mimo2, exaone_moe): the logits' miss,
a rewritten fixture's engine, build_moe_ffn's float64 formula and the rules their test_each_rule_is_needed turn
off the same way. The references are the committed transformers goldens (test_arch_vs_transformers.ref);
nothing here is produced by minfer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, load, ref, reference_switches, rel_err, rewrite


def assert_refused(name: str, tmp_path, kw: dict, match: str) -> None:
    """Fixture `name` rewritten with kw (test_arch_vs_transformers.rewrite's drop_keys / drop_tensors /
    add_tensors / set_keys) is refused on load by one MinferError whose message contains `match` (dots literal)."""
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


def cpu_quant_kl(name: str, tmp_path, monkeypatch) -> tuple[np.ndarray, float]:
    """Fixture `name` with MINFER_CPU_QUANT on (the CPU's default; MINFER_HOME under tmp_path): its logits over the
    golden's ids and their mean next-token KL from transformers' (the calibration's measure,
    runtime/cpu_calibration.py)."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    r = ref(name)
    eng = Engine.load(DATA / f"{name}.gguf", ctx=64, progress=False, switches=Switches(cpu_quant=True))
    got = eng.logits(r["ids"].tolist()).numpy()
    a = torch.log_softmax(torch.from_numpy(r["logits"]).double(), -1)
    b = torch.log_softmax(torch.from_numpy(got).double(), -1)
    return got, float((a.exp() * (a - b)).sum(-1).mean())


BIAS_GROUPS = ("qkv_bias", "output_bias", "mlp_biases", "norm_biases")


def drop_bias_group(m, what: str) -> None:
    """Take one group of biases out of model m, in place: qkv_bias (the fused attn_qkv's, else q/k/v's),
    output_bias (the attention output's), mlp_biases (ffn_up's and ffn_down's), norm_biases (every LayerNorm's,
    the final norm's too, zeroed); any other `what` changes nothing."""
    for b in m.blocks:
        if what == "qkv_bias":
            if hasattr(b, "attn_qkv_b"):
                b.attn_qkv_b = None
            else:
                b.attn_q_bias = b.attn_k_bias = b.attn_v_bias = None
        elif what == "output_bias":
            b.attn_output_b = None
        elif what == "mlp_biases":
            b.ffn_up_b = b.ffn_down_b = None
        elif what == "norm_biases":
            b.attn_norm_b = b.ffn_norm_b = torch.zeros_like(b.attn_norm_b)
    if what == "norm_biases":
        m.output_norm_b = torch.zeros_like(m.output_norm_b)


def logits_miss(name: str, eng) -> float:
    """eng's logits over fixture `name`'s golden ids against transformers' (test_arch_vs_transformers.rel_err)."""
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def rewritten_engine(name: str, tmp_path, **kw):
    """An Engine (ctx 64, the float32 reference switches) on fixture `name` rewritten with kw (rewrite's drop_keys /
    drop_tensors / add_tensors / set_keys) to tmp_path / x.gguf."""
    from minfer.runtime.engine import Engine

    return Engine.load(rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw), ctx=64, progress=False,
                       switches=reference_switches())


def sigmoid_biased_choice(e, c, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """build_moe_ffn's choice for sigmoid gating with a selection bias, renormalized and scaled, in float64: the
    top n_experts_used of sigmoid(h W_inp^T) + exp_probs_b, weighted by their sigmoid scores / their sum *
    expert_weights_scale -> (idx, w), both (T, n_experts_used)."""
    p = torch.sigmoid(h.double() @ e.gate_inp.double().T)                     # (T, E)
    idx = (p + e.exp_probs_b.double()).topk(c.n_experts_used, dim=-1)[1]
    w = p.gather(1, idx)
    return idx, w / w.sum(-1, keepdim=True) * c.expert_weights_scale


def swiglu_moe_f64(e, c, h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The MoE's output in float64 for the chosen experts idx with weights w (T, n_experts_used): sum_j w_j *
    down_k(silu(gate_k x) * up_k x), plus the shared SwiGLU expert where e has one (e.gate_shexp) -> (T, D)."""
    E, F, D = c.n_experts, c.expert_ffn, c.d_model
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    silu = torch.nn.functional.silu
    want = torch.zeros(h.shape[0], D, dtype=torch.float64)
    for t in range(h.shape[0]):
        x = h[t].double()
        for j in range(idx.shape[1]):
            k = idx[t, j]
            want[t] += w[t, j] * (down[k] @ (silu(gate[k] @ x) * (up[k] @ x)))
        if e.gate_shexp is not None:
            z = silu(e.gate_shexp.dense.double() @ x) * (e.up_shexp.dense.double() @ x)
            want[t] += e.down_shexp.dense.double() @ z
    return want


def sigmoid_moe_case(m, layer: int, seed: int):
    """Layer `layer`'s MoE of model m (sigmoid gating, a selection bias, the weights renormalized and scaled, a
    shared expert) on 6 rows of torch.manual_seed(seed)'s randn, and its float64 formula: (e, h, want)."""
    e, c = m.moe[layer], m.cfg
    torch.manual_seed(seed)
    h = torch.randn(6, c.d_model)
    return e, h, swiglu_moe_f64(e, c, h, *sigmoid_biased_choice(e, c, h))


def max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def break_rule(m, what: str) -> bool:
    """Turn off one rule of model m in place, for a test_each_rule_is_needed whose model has it; True if `what` is
    one of these (the same change on every model that takes it), False (m unchanged) otherwise:
    no_window (m.window 0), rope_on_global / no_rope_local (m.use_rope all on / all off), full_base_on_local
    (m.rope_local = cfg.rope), no_q_norm / no_k_norm (every block's per-head norm weights ones), softmax
    (cfg.expert_gating), no_select_bias (exp_probs_b None on m.moe[1:]), no_renorm (m.weights_norm off),
    no_scale (cfg.expert_weights_scale 1), no_shared (gate_shexp None on m.moe[1:]), moe_on_layer0 (layer 0's
    dense MLP replaced by layer 1's MoE)."""
    c = m.cfg
    if what == "no_window":
        m.window = 0
    elif what == "rope_on_global":
        m.use_rope = (True,) * c.n_layers
    elif what == "no_rope_local":
        m.use_rope = (False,) * c.n_layers
    elif what == "full_base_on_local":
        m.rope_local = c.rope
    elif what in ("no_q_norm", "no_k_norm"):
        attr = "attn_q_norm" if what == "no_q_norm" else "attn_k_norm"
        for b in m.blocks:
            setattr(b, attr, torch.ones_like(getattr(b, attr)))
    elif what == "softmax":
        m.cfg = replace(c, expert_gating="softmax")
    elif what == "no_select_bias":
        for e in m.moe[1:]:
            e.exp_probs_b = None
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_scale":
        m.cfg = replace(c, expert_weights_scale=1.0)
    elif what == "no_shared":
        for e in m.moe[1:]:
            e.gate_shexp = None
    elif what == "moe_on_layer0":
        m.moe = [m.moe[1]] + m.moe[1:]
    else:
        return False
    return True
