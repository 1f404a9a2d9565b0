"""The CPU load's memory check (minfer/runtime/cpu_memory.py): a model that cannot fit in the
available memory is one MinferError before any weight is read; the estimate covers what a load
holds."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA

MODEL = DATA / "qwen3moe.gguf"


def _load(quant: bool, path=MODEL):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(path, ctx=64, progress=False, switches=Switches(cpu_quant=quant))


@pytest.mark.parametrize("quant", [True, False])
def test_load_refused_when_the_weights_cannot_fit(quant, monkeypatch, tmp_path):
    import minfer.device as P
    import minfer.models as E
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.cpu_memory import cpu_load_bytes

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    need = cpu_load_bytes(GGUFFile(MODEL), quant)
    read = []
    real = E.load_model
    monkeypatch.setattr(E, "load_model", lambda *a, **k: (read.append(1), real(*a, **k))[1])
    monkeypatch.setattr(P, "available_memory", lambda device: need - 1)
    with pytest.raises(MinferError) as e:
        _load(quant)
    msg = str(e.value)
    assert not read                                                   # refused before the weights
    assert str(MODEL) in msg and "needs about" in msg and "is available" in msg
    assert f"{need / 2**20:.1f} MiB" in msg and f"{(need - 1) / 2**20:.1f} MiB" in msg
    assert f"MINFER_CPU_QUANT={0 if quant else 1}" in msg and "GPU" in msg
    monkeypatch.setattr(P, "available_memory", lambda device: need)      # just enough: it loads
    assert _load(quant).model is not None and read
    monkeypatch.setattr(P, "available_memory", lambda device: None)      # no figure: no check
    assert _load(quant).model is not None


def test_estimate_covers_what_the_load_holds(tmp_path, monkeypatch):
    """The estimate against the bytes the loaded model's tensors hold (the file's blocks are the
    memory map's, not counted): everything at least, and the experts exactly where they are in
    the int4 form the estimate assumes (the calibration's refusal repacks them in int8: qwen3moe's
    fixture, whose int4 split moves its logits by KL 0.10)."""
    from minfer.gguf_file import GGUFFile
    from minfer.ops.cpu_experts import PackedExperts
    from minfer.runtime import cpu_memory

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    exact = []
    for name in ("qwen3moe", "qwen2moe"):
        path = DATA / f"{name}.gguf"
        gf = GGUFFile(path)
        for quant in (True, False):
            eng = _load(quant, path)
            m = eng.model
            held = sum(w.nbytes() - w.raw.numel() for w in m.qweights())
            held += sum(t.numel() * t.element_size() for b in (*m.blocks, *m.moe) for t in vars(b).values()
                        if isinstance(t, torch.Tensor))
            experts = [w for w in m.qweights() if getattr(w, "n_experts", None)]
            # the float32 reference's experts dense (made after the load), the default's packed
            assert experts and all((w.dense is None) == quant for w in experts)
            assert held <= cpu_memory.cpu_load_bytes(gf, quant)
            if not quant:
                assert cpu_memory.expert_bytes(gf, False) == sum(w.dense.numel() * 4 for w in experts)
            if quant and not eng.cpu_quant_report["refused"]:
                assert all(isinstance(w.packed, PackedExperts) and w.packed.kind == "int4" for w in experts)
                assert cpu_memory.expert_bytes(gf, True) == sum(w.packed.nbytes() for w in experts)
                exact.append(name)
    assert exact == ["qwen2moe"]


def _held(model) -> int:
    """Bytes the model's tensors hold, the file's blocks (views of the memory map) left out."""
    from minfer.weights import QWeight

    seen, total = set(), 0

    def walk(o):
        nonlocal total
        if id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, QWeight):
            total += o.nbytes() - o.raw.numel() * o.raw.element_size()
        elif isinstance(o, torch.Tensor):
            total += o.numel() * o.element_size()
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif hasattr(o, "__dict__") and type(o).__module__.startswith("minfer.models"):
            for x in vars(o).values():
                walk(x)

    walk(model)
    return total


@pytest.mark.parametrize("path", sorted(DATA.glob("*.gguf")), ids=lambda p: p.stem)
def test_estimate_covers_every_architecture_on_the_default_path(path):
    """Every fixture (3-D tensors that are not experts included: deepseek2's attn_k_b / attn_v_b)
    passes the check, and packed as the default load packs it (prepare_model's int4 split; not
    through Engine.load, whose calibration text ernie4_5's fixture vocabulary cannot spell) holds
    no more than the estimate."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import cpu_quant
    from minfer.runtime.cpu_memory import check_cpu_memory, cpu_load_bytes

    gf = GGUFFile(path)
    check_cpu_memory(gf, True)
    m = load_model(gf, progress=False)
    dense = _held(m)
    assert 0 < dense <= cpu_load_bytes(gf, False)
    cpu_quant.prepare_model(m)
    assert 0 < _held(m) <= cpu_load_bytes(gf, True)
