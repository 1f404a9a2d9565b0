"""The CPU int4 split's check at load (Engine.load with Switches.cpu_quant): pack a CPU model's matrices
(ops/cpu_quant.py) and compare it with the float32 model on a calibration text; above the KL bound its
int4 matrices are packed in int8 instead. Engine re-exports the names (minfer.runtime.engine)."""

from __future__ import annotations

import torch

from minfer.runtime.kv_cache import KVCache

# The CPU int4 split (ops/cpu_quant.py) is a second rounding of the file's weights, and how much
# it costs depends on the model: the mean next-token KL against float32 on CPU_CALIBRATION was
# 0.025 for Qwen2.5-0.5B (perplexity +1.2% on textwrap.py), 0.071 for gemma-3-270m (+13%), 0.002
# for SmolLM2-135M (its Q4_1 blocks fit int4). Above the bound the int4 matrices are packed
# in int8 instead (KL 0.002-0.005 on all three), so no model loses more than that silently.
CPU_INT4_KL_MAX = 0.04
CPU_CALIBRATION = ("The history of the city begins in the Roman era, when a small settlement grew on the banks of the "
                   "river. Over the centuries it became a center of trade, learning and government. Today it is known "
                   "for its museums, its parks, its bridges and its food, and every year millions of visitors walk "
                   "through its old streets.")


def prepare_cpu_quant(model, tokenizer) -> dict:
    """Pack a CPU model's matrices (cpu_quant.prepare_model) and check the int4 split against the
    float32 model on CPU_CALIBRATION: above CPU_INT4_KL_MAX its int4 matrices become int8.
    Returns {"kl": mean KL of what is kept, "kl_int4": the split's, "refused": bool}."""
    from minfer.models.base import Step
    from minfer.ops import cpu_quant

    ids = tokenizer.encode(CPU_CALIBRATION)[:96]

    def logits():
        cache = KVCache.for_config(model.cfg, len(ids) + 8)
        return model.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), cache).double()

    def kl(a, b):      # mean over positions past the first few of KL(a || b)
        la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        return float((la.exp() * (la - lb)).sum(-1)[4:].mean())

    ref = logits()
    cpu_quant.prepare_model(model)
    got = kl(ref, logits())
    out = {"kl": got, "kl_int4": got, "refused": False}
    if got > CPU_INT4_KL_MAX:
        for w in model.qweights():
            if isinstance(w.packed, cpu_quant.Int4Weight):
                w.packed = cpu_quant.pack(w, w.packed.refine_top)      # from the blocks (no dense copy left)
        out.update(kl=kl(ref, logits()), refused=True)
    return out
