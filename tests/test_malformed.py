"""Bad GGUF input gives one MinferError naming the file -- never a crash, a hang or a huge allocation.

Every corrupt file is a copy of the tiny valid file of helpers_gguf (written by gguf's own
GGUFWriter), cut or patched at offsets located with gguf's own GGUFReader.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minfer import cli
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile

from helpers_gguf import TINY_TENSORS, layout, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[bytes, dict]:
    p = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return p.read_bytes(), layout(p)


def _write(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _expect_error(path: Path, *needles: str) -> str:
    with pytest.raises(MinferError) as e:
        GGUFFile(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def _expect_cli_error(path: Path, capsys) -> str:
    rc = cli.main(["inspect", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("minfer: error: ") and str(path) in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def test_valid_tiny_file_opens(tiny, tmp_path):
    # the control: the uncorrupted bytes open, so the errors below come from the corruption
    g = GGUFFile(_write(tmp_path, tiny[0], "good.gguf"))
    assert set(g.tensors) == set(TINY_TENSORS)


def test_missing_file(tmp_path, capsys):
    p = tmp_path / "nope.gguf"
    _expect_error(p, "no such file")
    _expect_cli_error(p, capsys)


def test_directory_is_not_a_model(tmp_path):
    _expect_error(tmp_path, "not a regular file")


def test_empty_file(tmp_path, capsys):
    p = _write(tmp_path, b"")
    _expect_error(p, "truncated header")
    _expect_cli_error(p, capsys)


def test_bad_magic(tiny, tmp_path, capsys):
    p = _write(tmp_path, b"GGML" + tiny[0][4:])
    _expect_error(p, "not a GGUF file")
    _expect_cli_error(p, capsys)
    p2 = _write(tmp_path, b"<html>not a model</html>" * 4, "page.gguf")
    _expect_error(p2, "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 77])
def test_unsupported_version(tiny, tmp_path, capsys, version):
    p = _write(tmp_path, _patch(tiny[0], 4, "<I", version))
    _expect_error(p, f"version {version}", "supported: 2, 3")
    _expect_cli_error(p, capsys)


def test_version_2_is_accepted(tiny, tmp_path):
    # v2 and v3 share the layout (64-bit counts); gguf's reader reads both
    g = GGUFFile(_write(tmp_path, _patch(tiny[0], 4, "<I", 2)))
    assert g.version == 2 and len(g.tensors) == len(TINY_TENSORS)


def test_big_endian_is_refused(tiny, tmp_path):
    p = _write(tmp_path, _patch(tiny[0], 4, ">I", 3))
    _expect_error(p, "big-endian")


def _cut_points(lay: dict, size: int) -> list[int]:
    """Every offset through the header, metadata and tensor infos; a spread through the data."""
    last_end = max(off + n for off, n in lay["data"].values())
    assert last_end == size  # the writer ends the file with the last tensor's data
    points = list(range(0, lay["tensor_info_end"] + 1))
    points += list(range(lay["tensor_info_end"] + 1, lay["data_start"], 3))
    for off, n in lay["data"].values():
        points += [off, off + 1, off + n // 2, off + n - 1]
    return sorted(set(p for p in points if p < size))


def test_truncated_everywhere(tiny, tmp_path):
    data, lay = tiny
    points = _cut_points(lay, len(data))
    assert len(points) > 1200
    p = tmp_path / "cut.gguf"
    for cut in points:
        p.write_bytes(data[:cut])
        with pytest.raises(MinferError) as e:
            GGUFFile(p)
        msg = str(e.value)
        assert str(p) in msg, (cut, msg)
        assert "truncated" in msg or "runs past the end" in msg, (cut, msg)


@pytest.mark.parametrize("where", ["header", "metadata", "tensor_infos", "tensor_data"])
def test_truncated_cli(tiny, tmp_path, capsys, where):
    data, lay = tiny
    cut = {"header": 13, "metadata": lay["kv"]["tokenizer.ggml.tokens"] + 30,
           "tensor_infos": lay["tensor_info"]["blk.0.attn_q.weight"] + 10,
           "tensor_data": lay["data"]["blk.0.attn_q.weight"][0] + 100}[where]
    line = _expect_cli_error(_write(tmp_path, data[:cut]), capsys)
    if where == "tensor_data":
        # the first tensor whose data is cut is named, with its offset, size and the file size
        off, n = lay["data"]["blk.0.attn_q.weight"]
        assert "'blk.0.attn_q.weight'" in line and f"offset {off}" in line
        assert f"{n} bytes" in line and f"file has {cut} bytes" in line


@pytest.mark.parametrize("field,value", [
    ("n_tensors", 1 << 62), ("n_kv", 1 << 62), ("n_tensors", 0xFFFFFFFFFFFFFFFF),
    ("n_kv", 10_000), ("n_tensors", 5_000),
])
def test_absurd_header_counts(tiny, tmp_path, capsys, field, value):
    at = {"n_tensors": 8, "n_kv": 16}[field]
    p = _write(tmp_path, _patch(tiny[0], at, "<Q", value))
    _expect_error(p, "corrupt header")
    _expect_cli_error(p, capsys)


def _array_len_at(lay: dict, key: str) -> int:
    # KV entry: key length u64 | key | value type u32 | item type u32 | count u64
    return lay["kv"][key] + 8 + len(key) + 4 + 4


@pytest.mark.parametrize("key,value", [
    ("tokenizer.ggml.token_type", 1 << 60),    # array of int32: gguf's reader would spin here
    ("tokenizer.ggml.token_type", 10_000_000),
    ("tokenizer.ggml.tokens", 1 << 61),        # array of strings
])
def test_absurd_array_length(tiny, tmp_path, key, value):
    p = _write(tmp_path, _patch(tiny[0], _array_len_at(tiny[1], key), "<Q", value))
    _expect_error(p, f"metadata '{key}'", "truncated")


def test_absurd_string_length(tiny, tmp_path):
    at = tiny[1]["kv"]["general.name"] + 8 + len("general.name") + 4
    p = _write(tmp_path, _patch(tiny[0], at, "<Q", 1 << 63))
    _expect_error(p, "metadata 'general.name'", "truncated")


def test_absurd_n_dims(tiny, tmp_path):
    p = _write(tmp_path, _patch(tiny[0], tiny[1]["n_dims_at"]["blk.0.attn_q.weight"], "<I", 1 << 31))
    _expect_error(p, "'blk.0.attn_q.weight'", "dimensions")


def test_unknown_metadata_value_type(tiny, tmp_path):
    at = tiny[1]["kv"]["general.name"] + 8 + len("general.name")
    p = _write(tmp_path, _patch(tiny[0], at, "<I", 99))
    _expect_error(p, "metadata 'general.name'", "unknown value type 99")


def test_absurd_counts_do_not_hang_or_allocate(tiny, tmp_path):
    """In a child process with 4 GiB of address space and a time limit: a clean error, exit 1."""
    data, lay = tiny
    files = [_write(tmp_path, _patch(data, 8, "<Q", 1 << 62), "a.gguf"),
             _write(tmp_path, _patch(data, _array_len_at(lay, "tokenizer.ggml.token_type"), "<Q",
                                     (1 << 64) - 1), "b.gguf")]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for p in files:
        res = subprocess.run([sys.executable, "-m", "minfer", "inspect", str(p)], capture_output=True,
                             text=True, timeout=120, preexec_fn=limit, env=env)
        assert res.returncode == 1, res.stderr
        assert res.stderr.startswith("minfer: error: ") and str(p) in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_tensor_offset_past_end(tiny, tmp_path, capsys):
    data, lay = tiny
    name = "blk.0.ffn_up.weight"
    rel = 1 << 20  # aligned, so only the bounds check can object
    p = _write(tmp_path, _patch(data, lay["offset_at"][name], "<Q", rel))
    msg = _expect_error(p, f"'{name}'", "runs past the end", f"file has {len(data)} bytes")
    assert f"offset {lay['data_start'] + rel}" in msg
    _expect_cli_error(p, capsys)


def test_misaligned_tensor_offset(tiny, tmp_path):
    data, lay = tiny
    name = "blk.0.attn_q.weight"
    rel = lay["data"][name][0] - lay["data_start"] + 4
    _expect_error(_write(tmp_path, _patch(data, lay["offset_at"][name], "<Q", rel)),
                  f"'{name}'", "alignment 32")


@pytest.mark.parametrize("type_id", [4, 5, 31, 99, 0xFFFFFFFF])  # 4/5: removed Q4_2/Q4_3
def test_unknown_tensor_type(tiny, tmp_path, capsys, type_id):
    name = "blk.0.attn_q.weight"
    p = _write(tmp_path, _patch(tiny[0], tiny[1]["type_at"][name], "<I", type_id))
    _expect_error(p, f"'{name}'", f"unknown ggml type id {type_id}")
    _expect_cli_error(p, capsys)


@pytest.mark.parametrize("name,ne0,block", [("token_embd.weight", 48, 32),
                                            ("blk.0.ffn_up.weight", 128, 256)])
def test_row_not_multiple_of_block(tiny, tmp_path, capsys, name, ne0, block):
    p = _write(tmp_path, _patch(tiny[0], tiny[1]["ne0_at"][name], "<Q", ne0))
    _expect_error(p, f"'{name}'", f"rows of {ne0} values", f"block size {block}")
    _expect_cli_error(p, capsys)


def test_duplicate_tensor_name(tiny, tmp_path):
    data, lay = tiny
    q, u = "blk.0.attn_q.weight", "blk.0.ffn_up.weight"  # same length: rename u to q in place
    assert len(q) == len(u)
    clash = bytearray(data)
    at = lay["tensor_info"][u] + 8
    clash[at:at + len(u)] = q.encode()
    _expect_error(_write(tmp_path, bytes(clash)), f"'{q}'", "twice")


def test_metadata_string_not_utf8(tiny, tmp_path, capsys):
    data, lay = tiny
    at = lay["kv"]["general.name"] + 8 + len("general.name") + 4 + 8  # first byte of the value
    bad = bytearray(data)
    bad[at] = 0xFF
    p = _write(tmp_path, bytes(bad))
    _expect_error(p, "metadata 'general.name'")
    _expect_cli_error(p, capsys)


def test_metadata_key_not_utf8(tiny, tmp_path):
    data, lay = tiny
    bad = bytearray(data)
    bad[lay["kv"]["general.name"] + 8] = 0xC3  # a lead byte followed by ASCII: invalid
    _expect_error(_write(tmp_path, bytes(bad)), "metadata key #1", "UTF-8")


# ---- issue 15: parse cost bounded by caps, layout checks, escaped names ---------------------

from gguf import GGUFValueType as VT  # noqa: E402

from test_fuzz_gguf import serialize, take_apart  # noqa: E402


def _sparse(tmp_path: Path, head: bytes, size: int, name: str = "crafted.gguf") -> Path:
    """A file of `size` bytes that starts with `head`; the rest is a hole (no disk, no time)."""
    p = tmp_path / name
    with open(p, "wb") as f:
        f.write(head)
        f.truncate(size)
    return p


@pytest.mark.parametrize("n_tensors,n_kv", [(2_500_000, 0), (0, 4_900_000), (70_000, 0), (0, 70_000)])
def test_crafted_counts_are_refused_by_the_caps(tmp_path, capsys, n_tensors, n_kv):
    # the 94 MiB files: millions of zero-size tensors or keys the size check allows
    p = _sparse(tmp_path, struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, n_kv), 94 << 20)
    _expect_error(p, "corrupt header", "at most 65,536")
    _expect_cli_error(p, capsys)


def test_crafted_huge_bool_array_is_refused(tmp_path):
    # 98 M bools in a 94 MiB file: refused by the per-array cap before a list is built
    head = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 3) + b"big" + \
        struct.pack("<IIQ", VT.ARRAY, VT.BOOL, 98_000_000)
    _expect_error(_sparse(tmp_path, head, 100 << 20), "metadata 'big'", "98,000,000 items")


def test_many_arrays_together_are_capped(tmp_path):
    # each array under the per-array cap, all of them past the total
    from minfer.gguf_file import MAX_ARRAY, MAX_ARRAY_ITEMS, MAX_STRING_ITEMS

    n = MAX_ARRAY_ITEMS // MAX_ARRAY + 1
    kvs = [(f"a{i}", VT.ARRAY, (VT.UINT8, [0] * MAX_ARRAY)) for i in range(n)]
    p = tmp_path / "arrays.gguf"
    p.write_bytes(serialize(kvs, [], b""))
    _expect_error(p, f"metadata 'a{n - 1}'", "in all")
    # strings (a Python object each) have a lower total
    kvs = [(f"s{i}", VT.ARRAY, (VT.STRING, [""] * (MAX_STRING_ITEMS // 2 + 1))) for i in range(2)]
    p.write_bytes(serialize(kvs, [], b""))
    _expect_error(p, "metadata 's1'", f"more than {MAX_STRING_ITEMS:,} strings")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The synthetic tiny qwen2 model taken apart: (kvs, tensors, data), see test_fuzz_gguf."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    path = write_synth(tmp_path_factory.mktemp("tm") / "tiny.gguf", get_preset("tiny"), "q8_0", progress=False).path
    return take_apart(path)


def _rebuilt(tmp_path, parts, kv=None, tensor=None, name="m.gguf") -> Path:
    kvs, tensors, data = parts
    kvs = [list(k) for k in kvs]
    tensors = [[n, list(ne), t, o] for n, ne, t, o in tensors]
    if kv:
        kv(kvs)
    if tensor:
        tensor(tensors)
    p = tmp_path / name
    p.write_bytes(serialize(kvs, tensors, data))
    return p


def _set(key, vtype, value):
    def f(kvs):
        for k in kvs:
            if k[0] == key:
                k[1], k[2] = vtype, value
                return
        kvs.append([key, vtype, value])
    return f


def test_overlapping_tensor_data_is_refused(tmp_path, tiny_model):
    def overlap(tensors):
        tensors[3][3] = tensors[2][3]  # the 4th tensor's data at the 3rd's offset
    p = _rebuilt(tmp_path, tiny_model, tensor=overlap)
    names = [t[0] for t in tiny_model[1][2:4]]
    msg = _expect_error(p, "overlap")
    assert all(f"'{n}'" in msg for n in names), msg


def _load(p):
    from minfer.config import ModelConfig

    return ModelConfig.from_gguf(GGUFFile(p))


@pytest.mark.parametrize("count", [3, 5, 0])
def test_block_count_must_match_the_blocks(tmp_path, tiny_model, count):
    p = _rebuilt(tmp_path, tiny_model, kv=_set("qwen2.block_count", VT.UINT32, count))
    with pytest.raises(MinferError) as e:
        _load(p)
    msg = str(e.value)
    assert "'qwen2.block_count'" in msg and f"= {count}" in msg, msg
    assert ("expected 4" in msg) if count else ("1..4,096" in msg)


@pytest.mark.parametrize("key,vtype,value,expect", [
    ("qwen2.context_length", VT.UINT32, 0, "expected an integer in 1.."),
    ("qwen2.attention.layer_norm_rms_epsilon", VT.FLOAT32, float("nan"), "finite number > 0"),
    ("qwen2.attention.layer_norm_rms_epsilon", VT.FLOAT32, -1e-6, "finite number > 0"),
    ("qwen2.rope.freq_base", VT.FLOAT32, 0.0, "finite number > 0"),
    ("qwen2.rope.freq_base", VT.FLOAT32, float("nan"), "finite number > 0"),
    ("qwen2.embedding_length", VT.STRING, "256", "got a string"),
    ("qwen2.feed_forward_length", VT.INT32, -640, "expected an integer in 1.."),
    ("qwen2.attention.head_count_kv", VT.UINT32, 3, "divisor of head_count"),
    ("tokenizer.ggml.bos_token_id", VT.FLOAT32, 1.5, "integer token id"),
    ("tokenizer.ggml.add_bos_token", VT.UINT32, 1, "a bool"),
])
def test_metadata_values_are_checked(tmp_path, tiny_model, key, vtype, value, expect):
    p = _rebuilt(tmp_path, tiny_model, kv=_set(key, vtype, value))
    with pytest.raises(MinferError) as e:
        _load(p)
    msg = str(e.value)
    assert f"'{key}'" in msg and expect in msg and str(p) in msg, msg
    assert "\n" not in msg


def test_byte_token_type_on_a_normal_token(tmp_path, tiny_model):
    def byte_type(kvs):
        for k in kvs:
            if k[0] == "tokenizer.ggml.token_type":
                itype, items = k[2]
                items = list(items)
                items[300] = 6  # BYTE, on a merged token whose text is not <0xXX>
                k[2] = (itype, items)
    with pytest.raises(MinferError, match=r"token 300 .* has type BYTE"):
        _load(_rebuilt(tmp_path, tiny_model, kv=byte_type))


def test_inspect_marks_bad_keys_and_escapes_names(tmp_path, tiny_model, capsys):
    def evil(kvs):
        _set("qwen2.rope.freq_base", VT.FLOAT32, 0.0)(kvs)
        _set("general.name", VT.STRING, "evil\x1b]0;owned\x07\nline")(kvs)
    p = _rebuilt(tmp_path, tiny_model, kv=evil)
    assert cli.main(["inspect", str(p)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;owned\\x07\\nline" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("rope.freq_base"))
    assert "invalid" in line and "finite number > 0" in line


def test_control_characters_in_a_tensor_name_are_escaped(tmp_path, tiny_model, capsys):
    def evil(tensors):
        tensors[0][0] = "a\x1b[2J\nb"
        tensors[1][0] = "a\x1b[2J\nb"  # a duplicate: the error names it
    p = _rebuilt(tmp_path, tiny_model, tensor=evil)
    msg = _expect_error(p, "appears twice")
    assert "a\\x1b[2J\\nb" in msg and "\x1b" not in msg
    _expect_cli_error(p, capsys)


def test_long_tensor_name_is_refused_shortly(tmp_path, tiny_model):
    def long(tensors):
        tensors[0][0] = "x" * (1 << 20)
    msg = _expect_error(_rebuilt(tmp_path, tiny_model, tensor=long), "1,048,576 bytes long")
    assert len(msg) < 400


# ---- issue 15: command-line inputs ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory, tiny_model):
    p = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    p.write_bytes(serialize(*tiny_model))
    return p


@pytest.mark.parametrize("argv,expect", [
    (["--seed", str(2**70)], "64 bits"),
    (["--stop", "\\x"], "--stop"),
    (["--temp", "nan"], "temperature"),
    (["--temp", "inf"], "temperature"),
    (["--repeat-penalty", "0"], "repeat_penalty"),
    (["--repeat-penalty", "nan"], "repeat_penalty"),
    (["--top-p", "2"], "top_p"),
    (["--top-k", "-5"], "top_k"),
    (["--ctx", str(10**12)], "--ctx"),
    (["\udcffbad utf-8"], "not valid UTF-8"),
])
def test_cli_inputs_are_one_line_errors(tiny_model_path, capsys, argv, expect):
    prompt = [] if not argv[0].startswith("-") else ["hi"]  # the UTF-8 case is the prompt itself
    rc = cli.main(["run", "-m", str(tiny_model_path), "--device", "cpu", "-n", "1", *argv, *prompt])
    out, err = capsys.readouterr()
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minfer: error: ") and expect in lines[0], err


def test_cli_invalid_utf8_on_stdin(tiny_model_path):
    r = subprocess.run([sys.executable, "-m", "minfer", "run", "-m", str(tiny_model_path), "--device", "cpu",
                        "-n", "1", "-"], input=b"Hi \xff there", capture_output=True, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.strip().count("\n") == 0, err
    assert "not UTF-8" in err and "byte 3" in err, err


def test_a_model_with_nan_logits_is_refused_at_load(tmp_path, tiny_model):
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import NonFiniteLogitsError

    kvs, tensors, data = tiny_model
    name, ne, qtype, off = next(t for t in tensors if t[0] == "output_norm.weight")
    assert qtype == 0  # F32: all-ones bytes are NaNs
    n = 4 * int(np.prod(ne))
    bad = data[:off] + b"\xff" * n + data[off + n:]
    p = tmp_path / "nan.gguf"
    p.write_bytes(serialize(kvs, tensors, bad))
    with pytest.raises(NonFiniteLogitsError, match="refused at load.*NaN logits"):
        Engine.load(str(p), device="cpu", ctx=32, progress=False)
    # the control: the same file with its real bytes loads
    p.write_bytes(serialize(kvs, tensors, data))
    Engine.load(str(p), device="cpu", ctx=32, progress=False)
