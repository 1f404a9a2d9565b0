"""Seeded fuzzing of a small real GGUF: every mutated file loads and generates, or ends in one
printable line of MinferError -- never another exception, a hang or a multi-line message.

The base file is minfer's synthetic `tiny` qwen2 model (Q4_K_M mix, a 512-token byte-level
vocab with ChatML), checked first against gguf's own GGUFReader. Each case takes the file
apart with that reader (typed metadata, tensor table, data), mutates it -- a metadata value
set to a hostile value or type, a key dropped or doubled, an array item broken, a tensor's
type, shape, offset or name changed, a tensor dropped, bytes of the header flipped, the file
cut -- and writes it back with the small GGUF writer below (ggml/docs/gguf.md's layout), so
that files gguf's writer would refuse can be made. The whole pipeline then runs: open,
`inspect`'s summary, Engine.load on the CPU, the chat template, one greedy token.

MINFER_FUZZ_CASES sets the number of cases (default 240), MINFER_FUZZ_SEED the seed.
"""

from __future__ import annotations

import os
import random
import signal
import struct
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGUFValueType as VT

from minfer.errors import MinferError

N_CASES = int(os.environ.get("MINFER_FUZZ_CASES", "240"))
SEED = int(os.environ.get("MINFER_FUZZ_SEED", "15"))
HANG_GUARD_S = 60  # a case running this long is a hang (a guard, not a timing assertion)

_SCALAR = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
           VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
           VT.FLOAT64: "<d"}


# ---- a minimal GGUF writer (ggml/docs/gguf.md), able to write invalid files ------------

def _str(s) -> bytes:
    b = s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: VT, value) -> bytes:
    if vtype == VT.STRING:
        return _str(value)
    if vtype == VT.ARRAY:
        itype, items = value
        return struct.pack("<IQ", itype, len(items)) + b"".join(_value(itype, x) for x in items)
    return struct.pack(_SCALAR[vtype], value)


def serialize(kvs: list, tensors: list, data: bytes, alignment: int = 32) -> bytes:
    """kvs: [(key, vtype, value)], array values as (item type, items); tensors: [(name, ne
    (ggml order), ggml type, offset into data)]."""
    out = [struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kvs))]
    for key, vtype, value in kvs:
        out.append(_str(key) + struct.pack("<I", vtype) + _value(vtype, value))
    for name, ne, qtype, offset in tensors:
        out.append(_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
                   + struct.pack("<IQ", qtype, offset))
    head = b"".join(out)
    return head + b"\0" * (-len(head) % alignment) + data


def take_apart(path: Path):
    """(kvs, tensors, data) of a valid file, read with gguf's GGUFReader (the oracle)."""
    r = gguf.GGUFReader(str(path))
    kvs = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        t = f.types[0]
        if t == VT.ARRAY:
            itype = f.types[1] if len(f.types) > 1 else VT.UINT8
            kvs.append((f.name, t, (itype, list(f.contents()))))
        else:
            kvs.append((f.name, t, f.contents()))
    start = min(int(t.data_offset) for t in r.tensors)
    tensors = [(t.name, [int(x) for x in t.shape], int(t.tensor_type), int(t.data_offset) - start)
               for t in r.tensors]
    raw = path.read_bytes()
    return kvs, tensors, raw[start:]


# ---- mutations ----------------------------------------------------------------------------

HOSTILE = [(VT.UINT32, 0), (VT.INT32, -1), (VT.UINT64, 2**63), (VT.UINT64, 2**64 - 1),
           (VT.FLOAT32, float("nan")), (VT.FLOAT32, float("inf")), (VT.FLOAT32, -1.0),
           (VT.FLOAT32, 0.0), (VT.FLOAT64, 1e308), (VT.STRING, "x\x1b]0;owned\x07\n\u202e"),
           (VT.BOOL, True), (VT.INT64, -2**63), (VT.UINT32, 2**32 - 1), (VT.UINT32, 1),
           (VT.UINT32, 3), (VT.STRING, "42"), (VT.ARRAY, (VT.INT32, [1, 2])), (VT.ARRAY, (VT.STRING, []))]
HOSTILE_ITEMS = {VT.STRING: ["", "a", "<0x41>", "\x00\x1b[31m", "x" * 300, "Ġ Ġ Ġ"],
                 VT.INT32: [-1, 6, 7, 99, 2**31 - 1, 3], VT.FLOAT32: [float("nan"), float("inf")]}
GGML_TYPES = [int(t) for t in gguf.GGML_QUANT_SIZES]


def mutate(rng: random.Random, kvs: list, tensors: list, data: bytes) -> tuple[bytes, str]:
    kvs = [list(k) for k in kvs]  # values are replaced, never changed in place
    tensors = [[name, list(ne), qtype, offset] for name, ne, qtype, offset in tensors]
    ops = ["set", "set", "set", "retype", "drop_key", "dup_key", "array_item", "array_len",
           "tensor_type", "tensor_shape", "tensor_offset", "tensor_name", "drop_tensor",
           "block_count", "flip_bytes", "truncate"]
    op = rng.choice(ops)
    # the keys the engine reads are the interesting ones; general.alignment stays valid
    keys = [i for i, k in enumerate(kvs) if k[0] != "general.alignment"]
    arrays = [i for i in keys if kvs[i][1] == VT.ARRAY]
    what = op
    if op == "set":
        i = rng.choice(keys)
        kvs[i][1], kvs[i][2] = rng.choice(HOSTILE)
        what = f"set {kvs[i][0]} = {kvs[i][2]!r:.40}"
    elif op == "retype":  # the same number written as another type
        i = rng.choice([j for j in keys if kvs[j][1] in _SCALAR] or keys)
        v = kvs[i][2]
        kvs[i][1], kvs[i][2] = rng.choice([(VT.STRING, str(v)), (VT.FLOAT32, 1.5), (VT.INT8, -3),
                                          (VT.BOOL, False), (VT.UINT64, 7)])
        what = f"retype {kvs[i][0]} as {kvs[i][1].name}"
    elif op == "drop_key":
        i = rng.choice(keys)
        what = f"drop {kvs[i][0]}"
        del kvs[i]
    elif op == "dup_key":
        i = rng.choice(keys)
        kvs.append(list(kvs[i]) if rng.random() < 0.5 else ["\x1b[2Jjunk.key\n", VT.UINT8, 1])
        what = f"duplicate/junk key after {kvs[i][0]}"
    elif op == "array_item" and arrays:
        i = rng.choice(arrays)
        itype, items = kvs[i][2]
        items = list(items)
        if items:
            j = rng.randrange(len(items))
            items[j] = rng.choice(HOSTILE_ITEMS.get(itype, [0]))
        kvs[i][2] = (itype, items)
        what = f"{kvs[i][0]}[{j if items else '-'}] broken"
    elif op == "array_len" and arrays:
        i = rng.choice(arrays)
        itype, items = kvs[i][2]
        kvs[i][2] = (itype, list(items)[: rng.choice([0, 1, len(items) // 2, len(items) - 1])])
        what = f"{kvs[i][0]} cut"
    elif op == "tensor_type":
        t = rng.choice(tensors)
        t[2] = rng.choice(GGML_TYPES + [99])
        what = f"{t[0]} type -> {t[2]}"
    elif op == "tensor_shape":
        t = rng.choice(tensors)
        k = rng.randrange(len(t[1]))
        t[1][k] = rng.choice([0, 1, t[1][k] * 2, t[1][k] // 2, 2**40, 2**63 + 5])
        if rng.random() < 0.2:
            t[1] = t[1][::-1]
        what = f"{t[0]} shape -> {t[1]}"
    elif op == "tensor_offset":
        t = rng.choice(tensors)
        other = rng.choice(tensors)
        t[3] = rng.choice([other[3], t[3] + 32, t[3] + 1, 2**62, 0])
        what = f"{t[0]} offset -> {t[3]}"
    elif op == "tensor_name":
        t = rng.choice(tensors)
        t[0] = rng.choice([rng.choice(tensors)[0], "blk.99.attn_q.weight", "x" * 70,
                           "blk.0.\x1b[31mattn_q.weight", "", "blk.-1.ffn_up.weight"])
        what = f"tensor renamed {t[0]!r:.30}"
    elif op == "drop_tensor":
        i = rng.randrange(len(tensors))
        what = f"drop tensor {tensors[i][0]}"
        del tensors[i]
    elif op == "block_count":
        i = next(j for j, k in enumerate(kvs) if k[0].endswith(".block_count"))
        kvs[i][2] = kvs[i][2] + rng.choice([-1, 1, -kvs[i][2]])
        what = f"block_count -> {kvs[i][2]}"
    blob = serialize(kvs, tensors, data)
    if op == "flip_bytes":
        b = bytearray(blob)
        head = len(blob) - len(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(head)] = rng.randrange(256)
        blob = bytes(b)
    elif op == "truncate":
        blob = blob[: rng.randrange(len(blob))]
    return blob, what


# ---- the pipeline -------------------------------------------------------------------------

def pipeline(path: Path) -> None:
    import torch

    from minfer.commands.inspect import render_text, summarize
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams
    from minfer.tokenizer.chat_template import chat_token_ids

    gf = GGUFFile(path)
    text = render_text(summarize(gf, with_tensors=True))
    assert all(line.isprintable() for line in text.splitlines()), "inspect printed a control character"
    eng = Engine.load(gf, device="cpu", ctx=48, progress=False)
    ids = chat_token_ids(eng.tokenizer, [{"role": "user", "content": "hi"}])
    with torch.inference_mode():
        events = list(eng.generate(ids, SamplingParams(temperature=0), 1))
    assert len(events) == 1


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    path = write_synth(tmp_path_factory.mktemp("fuzz") / "base.gguf", get_preset("tiny"), "q4_k_m",
                       progress=False).path
    return path, take_apart(path)


@pytest.fixture()
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add contention on CI's 2 cores
    yield
    torch.set_num_threads(n)


def test_base_round_trips(base, tmp_path, one_thread):
    """The control: the file rebuilt by the writer above equals the original and runs."""
    path, (kvs, tensors, data) = base
    again = tmp_path / "again.gguf"
    again.write_bytes(serialize(kvs, tensors, data))
    assert again.read_bytes() == path.read_bytes()
    pipeline(again)


@pytest.mark.slow
def test_fuzz_metadata_and_tensor_table(base, tmp_path, one_thread):
    _, (kvs, tensors, data) = base
    rng = random.Random(SEED)
    outcomes = {"ok": 0, "error": 0}
    failures = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(N_CASES):
            blob, what = mutate(rng, kvs, tensors, data)
            path = tmp_path / f"case{case}.gguf"
            path.write_bytes(blob)
            signal.alarm(HANG_GUARD_S)
            try:
                pipeline(path)
                outcomes["ok"] += 1
            except MinferError as e:
                msg = str(e)
                outcomes["error"] += 1
                if "\n" in msg or not msg.isprintable() or len(msg) > 1500:
                    failures.append(f"case {case} ({what}): not one printable line: {msg[:300]!r}")
            except _Hang:
                failures.append(f"case {case} ({what}): still running after {HANG_GUARD_S} s")
            except Exception as e:  # noqa: BLE001 -- exactly what the test is looking for
                failures.append(f"case {case} ({what}): {type(e).__name__}: {str(e)[:200]}")
            finally:
                signal.alarm(0)
                path.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not failures, f"{len(failures)} of {N_CASES} cases failed:\n" + "\n".join(failures[:20])
    # the mutations must reach both outcomes, or the test proves little
    assert outcomes["error"] > N_CASES // 4 and outcomes["ok"] > 0, outcomes
