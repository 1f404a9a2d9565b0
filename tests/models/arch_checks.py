"""Checks shared by the per-architecture tests (test_<arch>.py) on the fixtures of tests/data/arch: a rewritten
file refused by name, the CPU's default (int8/int4) path against transformers' logits, and dropping one group of
biases of a LayerNorm / biased-linear model (starcoder2, starcoder, gpt2, gptneox, bloom) for its rule-is-needed
test. The references are the committed transformers goldens (test_arch_vs_transformers.ref); nothing here is
produced by minfer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, load, ref, rewrite


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
