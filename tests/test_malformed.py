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
