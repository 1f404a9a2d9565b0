"""The CPU int4 split's check, cached per file (minfer/runtime/cpu_calibration.py): a second load
reads the recorded outcome instead of running the calibration, anything the outcome depends on
misses, a bad entry or an unwritable home never fails a load, and the packed bytes are those of
the checked load. Also pack/pack4 (ops/cpu_quant.py, packed a chunk of rows at a time) against
their formulas computed independently in numpy."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from minfer.ops import cpu_quant
from minfer.runtime import cpu_calibration as C
from minfer.weights import QWeight


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """`minfer synth --preset tiny` (qwen2, Q4_K/Q6_K/Q5_0/Q8_0 blocks, a byte-level vocab), as
    tests/ops/test_cpu_quant.py's."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    path = tmp_path_factory.mktemp("calib") / "tiny.gguf"
    write_synth(str(path), get_preset("tiny"), "q4_k_m", 0, None, progress=False)
    return path


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def load(path, progress=False):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(str(path), device="cpu", progress=progress, switches=Switches(cpu_quant=True))


def no_calibration(monkeypatch):
    """Make the calibration's forward passes fail: only a load that skips them can succeed."""
    class Refuse:
        @staticmethod
        def for_config(*a, **k):
            raise AssertionError("the calibration ran although its outcome was cached")
    monkeypatch.setattr(C, "KVCache", Refuse)


def packed_bytes(eng) -> dict:
    """Every packed tensor of a model, as raw bytes by weight name and field."""
    out = {}
    for w in eng.model.qweights():
        p = w.packed
        if p is None:
            continue
        parts = {"int4": p} if isinstance(p, cpu_quant.Int4Weight) else {"int8": p}
        if isinstance(p, cpu_quant.Int4Weight) and p.refine is not None:
            parts["refine"] = p.refine
        for kind, f in parts.items():
            names = ("packed", "sz", "nib") if kind == "int4" else ("q", "scale")
            for n in names:
                t = getattr(f, n).contiguous()
                out[(w.name, kind, n)] = t.view(torch.uint8).numpy().tobytes()
            out[(w.name, kind, "meta")] = (f.group,) if kind == "int4" else (f.refine_top,)
    return out


def entries(home):
    d = home / "cache" / "cpu_calibration"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def test_second_load_reads_the_cache_and_packs_the_same_bytes(tiny_gguf, home, monkeypatch, capsys):
    cold = load(tiny_gguf, progress=True)
    err = capsys.readouterr().err
    rep = cold.cpu_quant_report
    assert rep["cached"] is False and rep["refused"] is False
    assert "checking the int4 split of tiny.gguf" in err            # the silent phase has a bar
    [entry] = entries(home)
    assert json.loads(entry.read_text())["kl_int4"] == rep["kl_int4"]
    no_calibration(monkeypatch)
    warm = load(tiny_gguf, progress=True)
    err = capsys.readouterr().err
    assert "int4 check cached" in err
    assert warm.cpu_quant_report == {**rep, "cached": True}
    assert packed_bytes(warm) == packed_bytes(cold)
    assert any(isinstance(w.packed, cpu_quant.Int4Weight) for w in warm.model.qweights())
    quiet = load(tiny_gguf, progress=False)                            # no bar where the load shows none
    assert capsys.readouterr().err == "" and quiet.cpu_quant_report["cached"] is True


def test_a_cached_refusal_packs_the_refusals_bytes(tiny_gguf, home, monkeypatch):
    monkeypatch.setattr(C, "CPU_INT4_KL_MAX", 0.0)
    cold = load(tiny_gguf)
    assert cold.cpu_quant_report["refused"] is True and cold.cpu_quant_report["cached"] is False
    no_calibration(monkeypatch)
    warm = load(tiny_gguf)
    assert warm.cpu_quant_report == {**cold.cpu_quant_report, "cached": True}
    got = packed_bytes(warm)
    assert got == packed_bytes(cold)
    assert all(k[1] == "int8" for k in got)
    assert warm.model.output.packed.refine_top == cpu_quant.REFINE_TOP


def test_what_the_outcome_depends_on_misses(tiny_gguf, home, monkeypatch, tmp_path):
    assert load(tiny_gguf).cpu_quant_report["cached"] is False
    monkeypatch.setattr(C, "CPU_INT4_KL_MAX", 0.039)                 # another bound
    assert load(tiny_gguf).cpu_quant_report["cached"] is False
    monkeypatch.setattr(C, "CPU_CALIBRATION", C.CPU_CALIBRATION + " Again.")   # another text
    assert load(tiny_gguf).cpu_quant_report["cached"] is False
    assert len(entries(home)) == 3
    monkeypatch.undo()
    monkeypatch.setenv("MINFER_HOME", str(home))
    assert load(tiny_gguf).cpu_quant_report["cached"] is True
    # a copy elsewhere (another path), then the copy touched, then one byte of it changed with
    # its size and time put back: each misses
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    st = copy.stat()
    assert load(copy).cpu_quant_report["cached"] is False
    assert load(copy).cpu_quant_report["cached"] is True
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load(copy).cpu_quant_report["cached"] is False
    model = load(copy).model
    key = C.cache_key(copy, model)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1                                                       # the file's last (tensor) byte
    st = copy.stat()
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert copy.stat().st_size == st.st_size and C.cache_key(copy, model) != key
    with open(copy, "ab") as f:                                         # and a longer file
        f.write(b"\0")
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert C.cache_key(copy, model) != key


@pytest.mark.parametrize("bad", ["", "{not json", '{"kl": 0.01}', "[1, 2]",
                                 '{"key": "K", "kl": 0.01, "kl_int4": 0.01, "refused": "no"}',
                                 '{"key": "K", "kl": NaN, "kl_int4": 0.01, "refused": false}',
                                 '{"key": "other", "kl": 0.01, "kl_int4": 0.01, "refused": false}'])
def test_a_bad_entry_is_recomputed_and_rewritten(tiny_gguf, home, bad):
    rep = load(tiny_gguf).cpu_quant_report
    [entry] = entries(home)
    entry.write_text(bad.replace('"K"', f'"{entry.stem}"'))
    again = load(tiny_gguf).cpu_quant_report
    assert again["cached"] is False and again["kl_int4"] == pytest.approx(rep["kl_int4"])
    assert json.loads(entry.read_text())["kl_int4"] == again["kl_int4"]
    assert load(tiny_gguf).cpu_quant_report["cached"] is True


def test_old_entries_are_pruned(tiny_gguf, home, monkeypatch):
    monkeypatch.setattr(C, "CACHE_KEEP", 3)
    d = home / "cache" / "cpu_calibration"
    d.mkdir(parents=True)
    for i in range(5):                                                  # stale entries, oldest first
        f = d / f"{i:064x}.json"
        f.write_text("{}")
        os.utime(f, ns=(10**18 + i, 10**18 + i))
    load(tiny_gguf)
    left = {f.name for f in entries(home)}
    assert len(left) == 3 and {"3".zfill(64) + ".json", "4".zfill(64) + ".json"} < left
    assert load(tiny_gguf).cpu_quant_report["cached"] is True          # the new entry is kept


def test_an_unwritable_home_still_loads(tiny_gguf, tmp_path, monkeypatch):
    home = tmp_path / "a_file"
    home.write_text("not a folder")              # (root may write anywhere: a file cannot hold folders)
    monkeypatch.setenv("MINFER_HOME", str(home))
    for _ in range(2):
        rep = load(tiny_gguf).cpu_quant_report
        assert rep["cached"] is False and rep["refused"] is False
    assert home.read_text() == "not a folder"


# ---- pack / pack4 against numpy ----

def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32 (finite inputs)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def weight(n, k, seed):
    g = np.random.default_rng(seed)
    d = (g.standard_normal((n, k)) * 0.05).astype(np.float32)
    d[3, 7] = 2.0                  # an outlier: a coarse step for its group and row
    d[5] = 0.0                     # an all-zero row: the smallest scale, no division by zero
    d[6, :32] = 0.25               # a constant group
    return d, QWeight("w", 0, (n, k), torch.zeros(n, 1, dtype=torch.uint8), torch.from_numpy(d.copy()))


@pytest.mark.parametrize("chunk", [cpu_quant.PACK_CHUNK, 640 * 5])   # one chunk; 5-row chunks, the last short
def test_pack4_and_pack_are_their_formulas(monkeypatch, chunk):
    monkeypatch.setattr(cpu_quant, "PACK_CHUNK", chunk)
    N, K, G = 48, 640, cpu_quant.INT4_GROUP
    d, w = weight(N, K, seed=3)
    tiny = np.float32(2.0 ** -126)                # bfloat16's smallest normal, as float32's
    g = d.reshape(N, K // G, G)
    lo, hi = g.min(-1), g.max(-1)
    s = bf16(np.maximum((hi - lo) / np.float32(15), tiny))
    z = bf16(lo + np.float32(8) * s)
    q = np.clip(np.rint((g - z[..., None]) / s[..., None] + np.float32(8)), 0, 15).astype(np.uint8).reshape(N, K)
    p = cpu_quant.pack4(w, G, refine_top=7)
    assert np.array_equal(p.sz[..., 0].float().numpy(), s.T) and np.array_equal(p.sz[..., 1].float().numpy(), z.T)
    assert np.array_equal(p.nib.numpy(), q[:, 0::2] | (q[:, 1::2] << 4))
    # the kernel's layout of these codes, packed in one call (the layout's blocks are torch's)
    ref = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 2)
    assert torch.equal(p.packed, ref)
    sc = bf16(np.maximum(np.abs(d).max(1) / np.float32(127), tiny))
    q8 = np.clip(np.rint(d / sc[:, None]), -128, 127).astype(np.int8)
    for r in (p.refine, cpu_quant.pack(w, 7)):
        assert r.refine_top == 7
        assert np.array_equal(r.q.numpy(), q8) and np.array_equal(r.scale.float().numpy(), sc)
