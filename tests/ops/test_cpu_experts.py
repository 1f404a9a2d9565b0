"""Stacked MoE experts on the CPU fast path (minfer/ops/cpu_experts.py): each expert packed on its
own from the file's blocks, one expert decoded at a time, the same bytes as cpu_quant's pack /
pack4 of that expert's matrix (tested against their definitions in test_cpu_quant.py); the
kernels against float64 arithmetic on the packed values; moe_ffn's expert loop on them against a
by-hand float64 mixture; the calibration's refusal repacking experts in int8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minfer.ops import cpu_experts, cpu_quant, reference
from minfer.weights import QWeight

E, N, K = 4, 32, 64


def stacked(e=E, n=N, k=K, seed=0, scale=0.05):
    """A stacked expert QWeight (e*n, k) of F32 blocks (ggml type 0) and no dense copy."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(e * n, k, generator=g) * scale
    w = QWeight(f"blk.0.ffn_gate_exps.weight", 0, (e * n, k), dense.contiguous().view(torch.uint8), None)
    w.n_experts = e
    return w, dense


def spy_rows(w, monkeypatch):
    """The row counts w.dequantize_rows is asked for."""
    seen = []
    real = w.dequantize_rows

    def rows(ids):
        seen.append(len(ids))
        return real(ids)

    monkeypatch.setattr(w, "dequantize_rows", rows)
    return seen


@pytest.mark.parametrize("int4", [True, False])
def test_pack_experts_is_each_expert_packed_alone_from_its_blocks(int4, monkeypatch):
    w, dense = stacked()
    seen = spy_rows(w, monkeypatch)
    p = cpu_experts.pack_experts(w, int4)
    assert seen == [N] * E                                  # one expert's rows at a time, each once
    assert w.dense is None and p.kind == ("int4" if int4 else "int8") and p.shape == (N, K)
    assert p.a.dtype in (torch.uint8, torch.int8) and p.b.dtype == torch.bfloat16
    assert p.nbytes() == cpu_experts.packed_bytes((E, N, K), int4)
    assert p.nbytes() <= (0.625 if int4 else 1.07) * E * N * K     # float32 would be 4 bytes a weight
    for e in range(E):
        alone = QWeight("x", 0, (N, K), torch.zeros(N, 1, dtype=torch.uint8), dense[e * N:(e + 1) * N].clone())
        if int4:
            q = cpu_quant.pack4(alone)
            assert torch.equal(p.a[e], q.packed) and torch.equal(p.b[e], q.sz)
            # the kernel reads expert e's slice as that matrix (its output rounded to bf16)
            torch.testing.assert_close(p.dequantize(e), q.dequantize(), rtol=2 ** -8, atol=1e-9)
        else:
            q = cpu_quant.pack(alone)
            assert torch.equal(p.a[e], q.q) and torch.equal(p.b[e], q.scale)
            assert torch.equal(p.dequantize(e), q.dequantize())


def test_int4_falls_back_to_int8_for_experts_the_kernel_cannot_take():
    w, _ = stacked(n=24)                                     # 24 rows: not in the kernel's 16s
    assert cpu_experts.pack_experts(w, True).kind == "int8"
    assert cpu_experts.packed_bytes((E, 24, K), True) == E * (24 * K + 2 * 24)


@pytest.mark.parametrize("int4", [True, False])
@pytest.mark.parametrize("T", [1, 3, 17, 40])
def test_expert_linear_matches_float64_on_the_packed_values(int4, T):
    w, _ = stacked(seed=1)
    p = cpu_experts.pack_experts(w, int4)
    x = torch.randn(T, K, generator=torch.Generator().manual_seed(2))
    for e in (0, E - 1):
        y = p.linear(e, x)
        ref = x.to(torch.bfloat16).double() @ p.dequantize(e).double().T
        assert y.dtype == torch.float32 and y.shape == (T, N)
        assert float((y.double() - ref).abs().max()) <= 2 ** -7 * float(ref.abs().max())


def _by_hand(h, router, gws, uws, dws, k):
    """sum_k w_k down_e(silu(gate_e h) * up_e h), float64, from (E, n, K) weight stacks."""
    wts, idx = reference.route(h, router, k, True)
    out = torch.zeros(h.shape, dtype=torch.float64)
    for t in range(h.shape[0]):
        x = h[t].double()
        for j in range(k):
            e = int(idx[t, j])
            a = F.silu(gws[e] @ x) * (uws[e] @ x)
            out[t] += float(wts[t, j]) * (dws[e] @ a)
    return out


@pytest.mark.parametrize("int4", [True, False])
def test_moe_ffn_runs_the_packed_experts(int4, monkeypatch):
    """moe_ffn with packed experts is the mixture of the packed weights (bf16 activations); with
    none it is the float32 reference, the rows decoded per expert from the blocks exactly as a
    dense copy holds them."""
    D, Fe, k = K, N, 2
    gate, gd = stacked(seed=3)
    up, ud = stacked(seed=4)
    down, dd = stacked(n=D, k=Fe, seed=5)
    g = torch.Generator().manual_seed(6)
    h = torch.randn(9, D, generator=g)
    router = torch.randn(E, D, generator=g)
    ref32 = reference.moe_ffn(h, router, gate, up, down, k, True)
    for w, d in ((gate, gd), (up, ud), (down, dd)):
        w.dense = d
    assert torch.equal(reference.moe_ffn(h, router, gate, up, down, k, True), ref32)
    for w in (gate, up, down):
        w.dense = None
        w.packed = cpu_experts.pack_experts(w, int4)
    deq = [torch.stack([w.packed.dequantize(e).double() for e in range(E)]) for w in (gate, up, down)]
    before = torch.get_num_threads()
    got = reference.moe_ffn(h, router, gate, up, down, k, True)
    assert torch.get_num_threads() == before
    want = _by_hand(h, router, *deq, k)
    err = float((got.double() - want).norm() / want.norm())
    assert err < 2 ** -6, err                      # bf16 rounding of the inputs and activations
    exact = float((ref32.double() - want).norm() / want.norm())
    assert exact > (0.01 if int4 else 0.001)       # and the packed values are not the float32 ones


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """`minfer synth --preset tiny-moe` (qwen3moe, 8 experts of 256, Q4_K/Q6_K blocks)."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    write_synth(str(path), get_preset("tiny-moe"), "q4_k_m", 0, None, progress=False)
    return path


def _experts(eng):
    return [w for w in eng.model.qweights() if getattr(w, "n_experts", None)]


def test_engine_packs_experts_and_the_refusal_repacks_them_in_int8(tiny_moe, tmp_path, monkeypatch):
    """Engine.load's default: experts in int4, no dense copy; the calibration's refusal (forced by
    a zero bound) leaves every packed form int8, the experts' too."""
    import minfer.runtime.cpu_calibration as C
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    kept = Engine.load(str(tiny_moe), device="cpu", progress=False, switches=Switches(cpu_quant=True))
    assert kept.cpu_quant_report["refused"] is False
    ex = _experts(kept)
    assert len(ex) == 6 and all(w.dense is None and w.packed.kind == "int4" for w in ex)
    monkeypatch.setattr(C, "CPU_INT4_KL_MAX", 0.0)
    eng = Engine.load(str(tiny_moe), device="cpu", progress=False, switches=Switches(cpu_quant=True))
    assert eng.cpu_quant_report["refused"] is True
    assert all(w.dense is None and w.packed.kind == "int8" for w in _experts(eng))
    assert not any(cpu_quant.is_int4(w.packed) for w in eng.model.qweights())
    again = Engine.load(str(tiny_moe), device="cpu", progress=False, switches=Switches(cpu_quant=True))
    assert again.cpu_quant_report["cached"] is True                   # the refusal's forms, packed directly
    for a, b in zip(_experts(eng), _experts(again)):
        assert b.packed.kind == "int8" and torch.equal(a.packed.a, b.packed.a) and torch.equal(a.packed.b, b.packed.b)
