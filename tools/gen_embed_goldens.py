"""Write tests/data/embed/goldens.json.gz: llama.cpp's embeddings of the tiny architecture fixtures.

The independent reference for minfer's embeddings (minfer/runtime/embed.py): llama.cpp's own
pooled hidden rows (llama_get_embeddings_seq / llama_get_embeddings, via llama-cpp-python's
Llama.embed with normalize=False) on an F32 copy of each fixture (so llama.cpp's CPU matmuls keep
their activations in F32, as minfer's reference does; on F16 weights ggml-cpu rounds them to F16
first, 1-20% apart on these random models), for each fixture and pooling type, with the token ids that
llama.cpp's tokenizer gave (Llama.tokenize, as Llama.embed calls it). Nothing here imports minfer.

Also writes tests/data/embed/qwen3-embed.gguf: tests/data/arch/qwen3.gguf copied by gguf-py with
two keys added, as Qwen3-Embedding's files carry them: `qwen3.pooling_type` = 3 (last) and
`tokenizer.ggml.add_eos_token` = true (the EOS appended to every input). Its golden is made with
the file's own pooling (none asked).

It needs llama.cpp's shared library with llama-cpp-python's ctypes bindings (the 0.3.36 source
archive's vendor/llama.cpp built for the CPU, as tests/tokenizer/README.md says), then:

    PYTHONPATH=/tmp/llcpp-site python tools/gen_embed_goldens.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "tests" / "data" / "arch"
OUT = ROOT / "tests" / "data" / "embed"
# fixtures whose graph puts something between the output norm and the logits (gemma2's soft-cap,
# command-r's logit scale, granite's multiplier, phi2's output bias),
# one with the embedding scaled (gemma), one recurrent (mamba), and the plain qwen3 / llama3. Not chameleon:
# llama.cpp aborts on it with embeddings on (ggml.c:3517 GGML_ASSERT(ggml_nelements(a) >= ggml_nelements(b)))
FIXTURES = ["qwen3", "llama3", "gemma", "gemma2", "command-r", "granite", "phi2", "mamba"]
# the BERT encoders (tools/gen_bert_fixture.py): bidirectional attention, the hidden rows after the last
# layer_output_norm; bert-mean carries bert.pooling_type 1 (mean), so also its golden with the file's pooling
FIXTURES += ["bert", "bert-mean"]
FILE_POOLING = {"bert-mean"}
POOLINGS = {"mean": 1, "cls": 2, "last": 3, "none": 0}
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it"]


def copy_with_keys(src: Path, dst: Path, extra: dict, f32: bool = False) -> None:
    """src with `extra` keys added (key -> (value, GGUFValueType)), every tensor's bytes as they are; f32:
    every tensor dequantized to F32 by gguf-py instead (F16 -> F32 is exact)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in extra:
            continue
        vtype = f.types[0]
        val = 0 if f32 and key == "general.file_type" else f.contents()     # LLAMA_FTYPE_ALL_F32
        w.add_key_value(key, val, vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for key, (val, vtype) in extra.items():
        w.add_key_value(key, val, vtype)
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        if f32:
            x = dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, x.reshape(shape), raw_dtype=GGMLQuantizationType.F32)
        else:
            w.add_tensor(t.name, t.data, raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def embed(path: Path, pooling: int | None) -> dict:
    import llama_cpp

    kw = {} if pooling is None else {"pooling_type": pooling}
    # the KV cache in F32 (type_k / type_v 0: GGML_TYPE_F32; its default F16 rounds the keys and values, ~1e-3
    # apart on these models) and no flash attention (its CPU path converts to F16)
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False, **kw)
    out = []
    for text in TEXTS:
        ids = [int(t) for t in llm.tokenize(text.encode("utf-8"))]   # what Llama.embed tokenizes
        vec = llm.embed(text, normalize=False)
        out.append({"text": text, "ids": ids, "embedding": vec})
    return {"pooling_type": int(llm.pooling_type()), "inputs": out}


def main() -> int:
    from gguf import GGUFValueType

    OUT.mkdir(parents=True, exist_ok=True)
    qe = OUT / "qwen3-embed.gguf"
    copy_with_keys(ARCH / "qwen3.gguf", qe, {"qwen3.pooling_type": (3, GGUFValueType.UINT32),
                                               "tokenizer.ggml.add_eos_token": (True, GGUFValueType.BOOL)})
    goldens = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU), Llama.embed(normalize=False) "
                         "on an F32 copy of each fixture (gguf-py's dequantize; its F16 weights widened exactly); "
                         "command: PYTHONPATH=/tmp/llcpp-site python tools/gen_embed_goldens.py",
               "fixtures": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in FIXTURES:
            f32 = Path(tmp) / f"{name}.gguf"
            copy_with_keys(ARCH / f"{name}.gguf", f32, {}, f32=True)
            per = {}
            for pname, p in POOLINGS.items():
                per[pname] = embed(f32, p)
                assert per[pname]["pooling_type"] == p, (name, pname)
            if name in FILE_POOLING:
                per["file"] = embed(f32, None)
            goldens["fixtures"][name] = per
            print(name, "ok", file=sys.stderr)
        f32 = Path(tmp) / "qwen3-embed.gguf"
        copy_with_keys(qe, f32, {}, f32=True)
        goldens["fixtures"]["qwen3-embed"] = {"file": embed(f32, None)}
    write_json_gz(OUT / "goldens.json.gz", goldens, ascii_only=True)
    return 0


def write_json_gz(dst: Path, obj, ascii_only: bool = False) -> None:
    """obj as indent-0 JSON, gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under
    a size limit, so golden files over ~20 KB are stored this way (readers: gzip.decompress)."""
    import gzip

    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write((json.dumps(obj, indent=0, ensure_ascii=ascii_only) + "\n").encode("utf-8"))
    print("wrote", dst, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
