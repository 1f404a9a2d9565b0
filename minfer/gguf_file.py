"""Open and validate a GGUF file (llama.cpp's `gguf` package gives the type tables).

GGUFFile gives plain-Python metadata (str/int/float/bool/list) and a tensor table whose
entries carry the raw blocks as a memory-mapped uint8 array. Shapes are in torch/numpy
order: (rows, cols) = reversed ggml `ne` (ggml lists the fastest-varying dimension first).

Why a validation walk before `gguf.GGUFReader`: the reader trusts the bytes. On a corrupt
file it can loop for ever (an array of scalars whose count runs past the end of the file
reads empty slices of zero bytes and never advances), or fail deep inside numpy with a
message that names neither the file nor the field. So `_validate_layout` walks the header,
the key/value section and the tensor-info table with `struct` on a read-only mmap,
checking every length against the bytes that remain, and only then is the reader allowed
to parse. Nothing here reads tensor data: the file stays memory-mapped and lazy.

Why the walk also decodes the values (instead of handing over to gguf.GGUFReader after it):
the reader builds a Python object per array item, and took 9.7 s on the 0.5B Qwen file's
151,936 tokens + 151,387 merges on the dev box (2026-11-29), against ~0.3 s here with numpy
reads of scalar arrays. tests/test_gguf_file.py checks metadata and tensor table against
gguf.GGUFReader on the real models and on files the tests write: the reader stays the
reference, this is the fast path.

File layout (ggml/docs/gguf.md; ggml/src/gguf.cpp: gguf_init_from_file_impl), little-endian:
    header      magic "GGUF" | version u32 | n_tensors u64 | n_kv u64          (24 bytes)
    n_kv x      key: string | value type u32 | value
                  string = len u64 | utf-8 bytes;  array = item type u32 | count u64 | items
    n_tensors x name: string | n_dims u32 | ne[n_dims] u64 | ggml type u32 | offset u64
    padding     to `general.alignment` (default 32)
    tensor data each tensor at data_start + offset, offset a multiple of the alignment
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minfer.errors import MinferError
from minfer.safe_text import quoted, safe

SUPPORTED_VERSIONS = (2, 3)  # v1 used 32-bit counts and is gone from llama.cpp
GGML_MAX_DIMS = 4            # ggml.h
DEFAULT_ALIGNMENT = 32       # GGUF_DEFAULT_ALIGNMENT

_HEADER = struct.Struct("<4sIQQ")
# The least bytes one entry can take; a count that needs more bytes than the file has is
# corrupt, and is rejected before anything is allocated for it.
#   KV: key length u64 + a 1-byte key + type u32 + the smallest value (u8/i8/bool: 1 byte)
#   tensor info: name length u64 + n_dims u32 + type u32 + offset u64 (n_dims 0, empty name)
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# Parse cost must not grow faster than real files need (issue 15: a 94 MiB file of 2.5 M
# zero-size tensors took a minute and 2.6 GB to open). Caps far above real models (the
# largest known have ~2,000 tensors, ~50 keys and 262,144-entry vocab arrays) bound the walk
# to about a second whatever the file says.
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 14
MAX_ARRAY = 1 << 21          # items in one metadata array
MAX_ARRAY_ITEMS = 1 << 22    # items in all metadata arrays together
MAX_STRING_ITEMS = 1 << 21   # strings in all metadata arrays together (each is a Python object)
MAX_KEY_BYTES = 1 << 10
GGML_MAX_NAME = 64           # ggml.h; gguf.cpp refuses a tensor name of 64 bytes or more
INT64_MAX = (1 << 63) - 1    # ggml counts elements in int64_t; gguf.cpp refuses ne < 0 or overflow

# GGUF metadata value types (gguf.GGUFValueType): id -> (name, fixed byte size or None)
_VALUE_TYPES = {
    0: ("uint8", 1), 1: ("int8", 1), 2: ("uint16", 2), 3: ("int16", 2), 4: ("uint32", 4),
    5: ("int32", 4), 6: ("float32", 4), 7: ("bool", 1), 8: ("string", None), 9: ("array", None),
    10: ("uint64", 8), 11: ("int64", 8), 12: ("float64", 8),
}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_ARCH_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # llama.cpp's names: llama, qwen2, gemma3, ...


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int              # ggml type id (gguf.GGMLQuantizationType value)
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a 2-D weight
    n_elements: int
    n_bytes: int
    offset: int             # absolute byte offset in the file
    data: np.ndarray        # uint8, (n_bytes,), memory-mapped raw blocks

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.qtype)


def ggml_type_name(qtype: int) -> str:
    """'Q4_K' for 12; 'type99' for an id the gguf package does not know."""
    import gguf

    try:
        return gguf.GGMLQuantizationType(qtype).name
    except ValueError:
        return f"type{qtype}"


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (block size in values, bytes per block), from the gguf package."""
    import gguf

    return {int(t): sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()}


class _Walker:
    """Bounds-checked little-endian reads over a read-only buffer; errors name the file."""

    def __init__(self, path: Path, buf: mmap.mmap | bytes, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.array_items = 0   # items of all metadata arrays read so far (capped: MAX_ARRAY_ITEMS)
        self.string_items = 0  # of which strings (capped: MAX_STRING_ITEMS)

    def fail(self, what: str) -> MinferError:
        return MinferError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated {what}: needs {n} bytes at offset {self.pos}, "
                            f"but the file has {self.size} bytes")

    def unpack(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        self.need(n, what)
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return vals

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)[0]

    def skip_string(self, what: str) -> None:
        n = self.u64(f"{what} (string length)")
        self.need(n, f"{what} (string of {n} bytes)")
        self.pos += n

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"{what} (string length)")
        if max_bytes is not None and n > max_bytes:
            raise self.fail(f"{what} is {n:,} bytes long, more than the {max_bytes:,} allowed")
        self.need(n, f"{what} (string of {n} bytes)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e})") from None


@dataclass(frozen=True)
class _Layout:
    version: int
    alignment: int
    data_start: int
    # name -> (qtype, ne (ggml order), relative offset, n_bytes)
    tensors: dict[str, tuple[int, tuple[int, ...], int, int]]
    metadata: dict[str, Any]


def _validate_layout(path: Path) -> _Layout:
    """Walk header, metadata and tensor infos with bounds checks; raise MinferError on any fault."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size < _HEADER.size:
                head = f.read()
                if len(head) >= 4 and head[:4] != b"GGUF":
                    raise MinferError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
                raise MinferError(f"{path}: truncated header: the file has {size} bytes, "
                                  f"a GGUF header needs {_HEADER.size}")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise MinferError(f"{path}: cannot read the file ({e.strerror or e})") from None
    try:
        return _walk(path, buf, size)
    finally:
        buf.close()


def _walk(path: Path, buf: mmap.mmap, size: int) -> _Layout:
    w = _Walker(path, buf, size)
    magic, version, n_tensors, n_kv = w.unpack("<4sIQQ", "header")
    if magic != b"GGUF":
        raise w.fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    if version & 0xFFFF == 0 and version != 0:
        # the version reads as 0x00030000 when the writer was big-endian
        raise w.fail("big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise w.fail(f"GGUF version {version} is not supported (supported: "
                     f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise w.fail(f"corrupt header: {n_tensors:,} tensors and {n_kv:,} metadata keys; minfer "
                     f"accepts at most {MAX_TENSORS:,} of each (real models have a few thousand)")
    least = _HEADER.size + n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES
    if least > size:
        raise w.fail(f"corrupt header: {n_tensors} tensors and {n_kv} metadata keys need at "
                     f"least {least} bytes, but the file has {size} bytes")

    alignment = DEFAULT_ALIGNMENT
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = w.string(f"metadata key #{i}", MAX_KEY_BYTES)
        if key in metadata:
            raise w.fail(f"metadata key {quoted(key)} appears twice")
        vtype = w.u32(f"type of metadata {quoted(key)}")
        if key == "general.alignment":
            if vtype != _UINT32:
                raise w.fail(f"metadata 'general.alignment' has type {vtype}, expected uint32")
            alignment = w.u32("value of metadata 'general.alignment'")
            if alignment == 0 or alignment & (alignment - 1):
                raise w.fail(f"metadata 'general.alignment' = {alignment}, expected a power of two")
            metadata[key] = alignment
            continue
        metadata[key] = _read_value(w, vtype, f"metadata {quoted(key)}")

    sizes = _quant_sizes()
    tensors: dict[str, tuple[int, tuple[int, ...], int, int]] = {}
    for i in range(n_tensors):
        name = w.string(f"name of tensor #{i}", GGML_MAX_NAME - 1)
        where = f"tensor {quoted(name)}"
        if name in tensors:
            raise w.fail(f"{where} appears twice in the tensor table")
        n_dims = w.u32(f"{where} (n_dims)")
        if n_dims > GGML_MAX_DIMS:
            raise w.fail(f"{where} has {n_dims} dimensions, at most {GGML_MAX_DIMS} are allowed")
        ne = w.unpack(f"<{n_dims}Q", f"{where} (shape)") if n_dims else ()
        n_elements = math.prod(ne)  # exact (Python ints); 1 for a scalar
        if any(x > INT64_MAX for x in ne) or n_elements > INT64_MAX:
            raise w.fail(f"{where} has shape {list(ne)}: more than 2**63 - 1 elements")
        qtype, rel_offset = w.unpack("<IQ", f"{where} (type and offset)")
        if qtype not in sizes:
            raise w.fail(f"{where} has unknown ggml type id {qtype}")
        block, type_size = sizes[qtype]
        if ne and ne[0] % block:
            raise w.fail(f"{where} ({ggml_type_name(qtype)}) has rows of {ne[0]} values, which is "
                         f"not a multiple of the type's block size {block}")
        tensors[name] = (qtype, tuple(ne), rel_offset, n_elements // block * type_size)

    data_start = -(-w.pos // alignment) * alignment
    for name, (qtype, ne, rel, n_bytes) in tensors.items():
        if rel % alignment:
            raise w.fail(f"tensor {quoted(name)} has data offset {rel}, not a multiple of the "
                         f"alignment {alignment}")
        start = data_start + rel
        if start + n_bytes > size:
            raise w.fail(f"tensor {quoted(name)} runs past the end of the file: its data is at offset "
                         f"{start} with {n_bytes} bytes (ends at {start + n_bytes}), but the file "
                         f"has {size} bytes (truncated tensor data?)")
    _check_overlap(w, tensors)
    return _Layout(version, alignment, data_start, tensors, metadata)


def _check_overlap(w: _Walker, tensors: dict) -> None:
    """Two tensors may not share bytes (llama.cpp's gguf.cpp goes further and requires each
    tensor to start where the previous one's padded data ends)."""
    spans = sorted((rel, rel + n_bytes, name) for name, (_, _, rel, n_bytes) in tensors.items() if n_bytes)
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise w.fail(f"tensors {quoted(a)} (bytes {s0}..{e0}) and {quoted(b)} (bytes {s1}..{e1} "
                         "of the data section) overlap")


# little-endian numpy dtypes of the fixed-size value types, for whole-array reads
_NP_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
             10: "<u8", 11: "<i8", 12: "<f8"}


def _read_value(w: _Walker, vtype: int, what: str) -> Any:
    """One metadata value as plain Python (what gguf's ReaderField.contents() returns)."""
    if vtype not in _VALUE_TYPES:
        raise w.fail(f"{what} has unknown value type {vtype}")
    fixed = _VALUE_TYPES[vtype][1]
    if fixed is not None:
        w.need(fixed, f"{what} ({_VALUE_TYPES[vtype][0]} value)")
        val = np.frombuffer(w.buf, dtype=_NP_TYPES[vtype], count=1, offset=w.pos)[0]
        w.pos += fixed
        return bool(val) if vtype == 7 else val.item()
    if vtype == _STRING:
        return w.string(what)
    itype = w.u32(f"{what} (array item type)")
    count = w.u64(f"{what} (array length)")
    if itype not in _VALUE_TYPES:
        raise w.fail(f"{what} is an array of unknown value type {itype}")
    if itype == _ARRAY:
        raise w.fail(f"{what} is an array of arrays, which GGUF readers do not support")
    fixed = _VALUE_TYPES[itype][1]
    if fixed is not None:
        w.need(count * fixed, f"{what} (array of {count} {_VALUE_TYPES[itype][0]})")
        _count_items(w, count, what)
        arr = np.frombuffer(w.buf, dtype=_NP_TYPES[itype], count=count, offset=w.pos)
        w.pos += count * fixed
        return [bool(x) for x in arr] if itype == 7 else arr.tolist()
    # each string takes at least its 8-byte length: reject absurd counts up front
    w.need(count * 8, f"{what} (array of {count} strings)")
    _count_items(w, count, what)
    w.string_items += count
    if w.string_items > MAX_STRING_ITEMS:
        raise w.fail(f"{what}: the file's string arrays hold more than {MAX_STRING_ITEMS:,} strings "
                     "in all, more than minfer accepts")
    return _strings(w, count, what)


_U64 = struct.Struct("<Q")


def _strings(w: _Walker, count: int, what: str) -> list[str]:
    """`count` strings (u64 length + UTF-8 bytes each): the walker's checks in one tight loop,
    since a vocabulary has ~10^5 of them (about 0.3 us each on the dev box)."""
    buf, pos, size, unpack = w.buf, w.pos, w.size, _U64.unpack_from
    out = []
    for j in range(count):
        if size - pos < 8:
            w.pos = pos
            w.need(8, f"{what}[{j}] (string length)")
        (n,) = unpack(buf, pos)
        pos += 8
        if n > size - pos:
            w.pos = pos
            w.need(n, f"{what}[{j}] (string of {n} bytes)")
        raw = buf[pos:pos + n]
        pos += n
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            w.pos = pos
            raise w.fail(f"{what}[{j}] is not valid UTF-8 ({e})") from None
    w.pos = pos
    return out


def _count_items(w: _Walker, count: int, what: str) -> None:
    w.array_items += count
    if count > MAX_ARRAY or w.array_items > MAX_ARRAY_ITEMS:
        raise w.fail(f"{what} is an array of {count:,} items; minfer accepts at most {MAX_ARRAY:,} "
                     f"per array and {MAX_ARRAY_ITEMS:,} in all (the largest real vocabularies have "
                     "about 262,000 tokens)")


class GGUFFile:
    """A validated GGUF file: `metadata`, `tensors` (name -> TensorInfo), `architecture`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise MinferError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise MinferError(f"{self.path}: not a regular file")
        layout = _validate_layout(self.path)
        self.version = layout.version
        self.alignment = layout.alignment
        self.data_offset = layout.data_start
        self.file_size = self.path.stat().st_size
        self.metadata: dict[str, Any] = layout.metadata
        # One read-only memory map of the whole file; each tensor's data is a view of it.
        try:
            mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise MinferError(f"{self.path}: cannot memory-map the file ({e})") from None
        # slices of a plain-ndarray view of the map: still mapped (the memmap is their base),
        # without np.memmap's per-slice bookkeeping (65,536 tensors took a second)
        view = mm.view(np.ndarray)
        self.tensors: dict[str, TensorInfo] = {}
        for name, (qtype, ne, rel, n_bytes) in layout.tensors.items():
            start = layout.data_start + rel
            shape = tuple(int(x) for x in reversed(ne))
            self.tensors[name] = TensorInfo(name, qtype, shape, math.prod(ne), n_bytes, start,
                                            view[start:start + n_bytes])

    @property
    def architecture(self) -> str:
        arch = self.require("general.architecture")
        if not isinstance(arch, str) or not _ARCH_NAME.fullmatch(arch):
            raise MinferError(f"{self.path}: metadata 'general.architecture' = {safe(arch, 40)}: "
                              "expected a name of letters, digits, '_', '-' and '.' (e.g. 'llama')")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise MinferError(f"{self.path}: metadata key {quoted(key)} is missing")
        return self.metadata[key]

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`{architecture}.{suffix}`, e.g. arch_get('block_count')."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise MinferError(f"{self.path}: tensor {quoted(name)} is missing")
        return self.tensors[name]

    def file_type_name(self) -> str | None:
        """`general.file_type` as llama.cpp names it ('Q4_K_M'), None when the key is absent."""
        ftype = self.get("general.file_type")
        if ftype is None:
            return None
        if not isinstance(ftype, int) or isinstance(ftype, bool):
            return f"invalid ({safe(ftype, 30)})"
        return file_type_name(ftype)

    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())


def file_type_name(ftype: int) -> str:
    """llama.cpp's name for a `general.file_type` value: 15 -> 'Q4_K_M', 0 -> 'F32'.

    The ids are llama.h's `enum llama_ftype` (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15 ...), which the
    gguf package mirrors as gguf.LlamaFileType; the printed name drops the 'MOSTLY_' prefix
    the way llama_model_ftype_name() does.
    """
    import gguf

    try:
        name = gguf.LlamaFileType(ftype).name
    except ValueError:
        return f"unknown({ftype})"
    if name == "ALL_F32":
        return "F32"
    return name.removeprefix("MOSTLY_")
