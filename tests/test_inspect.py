"""`minfer inspect` on the real models of MODELS.md, against gguf.GGUFReader and MODELS.md's numbers."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

import gguf
from minfer import cli
from minfer.catalog import resolve_model

from helpers_gguf import TINY_TENSORS, write_tiny_gguf

# From ../shared/MODELS.md (checked there against the files): arch, layers, tensor types.
EXPECTED = {
    "qwen2.5-coder-0.5b-instruct": ("qwen2", 24, "Q4_K_M",
                                    {"Q4_K": 12, "Q6_K": 12, "Q5_0": 133, "Q8_0": 13, "F32": 121}),
    "smollm2-135m-instruct": ("llama", 30, "Q4_1", {"Q4_1": 210, "Q8_0": 1, "F32": 61}),
}


def _run(argv: list[str], capsys) -> str:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def _reference(path) -> tuple[str, int, Counter, int]:
    """arch, block_count, type counts and tensor bytes as gguf's own reader sees them."""
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    layers = r.fields[f"{arch}.block_count"].contents()
    counts = Counter(gguf.GGMLQuantizationType(t.tensor_type).name for t in r.tensors)
    blk = {int(m.group(1)) for t in r.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    assert blk == set(range(layers))  # the layer count is also what the tensor names show
    return arch, layers, counts, sum(int(t.n_bytes) for t in r.tensors)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_inspect_real_model(name, capsys):
    path = resolve_model(name)
    arch, layers, ftype, counts = EXPECTED[name]
    ref_arch, ref_layers, ref_counts, ref_bytes = _reference(path)
    assert (ref_arch, ref_layers, dict(ref_counts)) == (arch, layers, counts)

    s = json.loads(_run(["inspect", name, "--json"], capsys))
    assert s["architecture"] == arch and s["n_layers"] == layers
    assert s["hparams"]["block_count"] == layers
    assert s["file_type"] == ftype
    assert {k: v["count"] for k, v in s["tensor_types"].items()} == counts
    assert s["tensor_bytes"] == ref_bytes
    assert abs(sum(v["share"] for v in s["tensor_types"].values()) - 1.0) < 1e-9
    assert s["file_size"] == path.stat().st_size
    # no giant arrays in the JSON: the vocabulary is summarized by its length
    assert s["tokenizer"]["vocab_size"] == {"qwen2": 151936, "llama": 49152}[arch]
    assert "tokens" not in s["tokenizer"]
    assert s["tokenizer"]["chat_template"] is True

    text = _run(["inspect", str(path)], capsys)
    assert re.search(rf"^architecture:\s+{arch}$", text, re.M)
    assert re.search(rf"^layers:\s+{layers}$", text, re.M)
    assert re.search(rf"^file type:\s+{ftype}$", text, re.M)
    for qtype, n in counts.items():
        assert re.search(rf"^\s+{qtype}\s+{n}\s", text, re.M), (qtype, text)


def test_inspect_tiny_tensors_and_json(tmp_path, capsys):
    p = write_tiny_gguf(tmp_path / "tiny.gguf")
    s = json.loads(_run(["inspect", str(p), "--json", "--tensors"], capsys))
    assert [t["name"] for t in s["tensors"]] == list(TINY_TENSORS)
    for t in s["tensors"]:
        qtype, shape = TINY_TENSORS[t["name"]]
        assert t["type"] == qtype.name and tuple(t["shape"]) == shape
    ref = gguf.GGUFReader(str(p))
    assert {t["name"]: t["bytes"] for t in s["tensors"]} == {t.name: int(t.n_bytes) for t in ref.tensors}
    assert s["n_params"] == 16 * 64 + 64 + 64 * 64 + 8 * 256 + 64
    assert s["n_params_human"] == "7.3K"
    text = _run(["inspect", str(p), "--tensors"], capsys)
    assert re.search(r"^\s+blk\.0\.ffn_up\.weight\s+Q4_K\s+8x256\s+1,152$", text, re.M)


def test_inspect_unsupported_architecture_still_works(tmp_path, capsys):
    p = write_tiny_gguf(tmp_path / "g.gguf", arch="gemma3")
    text = _run(["inspect", str(p)], capsys)
    assert re.search(r"^architecture:\s+gemma3$", text, re.M)
    assert "gemma3.*" in text and re.search(r"^\s+block_count\s+1$", text, re.M)


def test_human_count():
    from minfer.commands.inspect import human_count

    assert human_count(494_032_768) == "494.0M"
    assert human_count(7_615_616_512) == "7.62B"
    assert human_count(999) == "999"


def test_inspect_says_what_pooling_type_means():
    """An embedding model's file: pooling_type 3 shown with what minfer makes of it (runtime/embed.py)."""
    import subprocess
    import sys
    from pathlib import Path

    f = Path(__file__).resolve().parent / "data" / "embed" / "qwen3-embed.gguf"
    out = subprocess.run([sys.executable, "-m", "minfer", "inspect", str(f)], capture_output=True, text=True,
                         check=True).stdout
    assert "pooling_type                      3  (last: minfer embed)" in out


def test_inspect_shows_array_and_string_hyperparameters(tmp_path):
    """A hyper-parameter holding an array or a string (gemma4's per-layer counts; a malformed pooling_type) is
    shown, not a crash: the pooling note looks at integer pooling_type values only (a list key was unhashable)."""
    import subprocess
    import sys

    import gguf

    p = tmp_path / "arr.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3")
    w.add_block_count(2)
    w.add_array("qwen3.attention.head_count_kv", [1, 2])
    w.add_string("qwen3.pooling_type", "last")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = subprocess.run([sys.executable, "-m", "minfer", "inspect", str(p)], capture_output=True, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    assert "head_count_kv" in r.stdout and "pooling_type" in r.stdout, r.stdout
    assert "(last: minfer embed)" not in r.stdout
