"""A tiny valid GGUF file for tests, written by the `gguf` package's own GGUFWriter.

The writer is llama.cpp's reference, so a file it writes is valid by definition; the
malformed-file tests corrupt copies of it. Offsets of the parts to corrupt are found with
the `gguf` package's GGUFReader (an independent reading), not with minfer's code.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

# name -> (ggml type, numpy-order shape); a few types, block sizes 1, 32 and 256
TINY_TENSORS = {
    "token_embd.weight": (T.Q8_0, (16, 64)),
    "blk.0.attn_norm.weight": (T.F32, (64,)),
    "blk.0.attn_q.weight": (T.F16, (64, 64)),
    "blk.0.ffn_up.weight": (T.Q4_K, (8, 256)),
    "output_norm.weight": (T.F32, (64,)),
}
TINY_TOKENS = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(13)]


def write_tiny_gguf(path: str | Path, arch: str = "llama", seed: int = 0) -> Path:
    """Write a small valid GGUF at `path`: metadata of a one-layer `arch` model + TINY_TENSORS."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(256)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TINY_TOKENS)
    w.add_token_types([1] * len(TINY_TOKENS))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, (qtype, shape) in TINY_TENSORS.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if qtype == T.F32:
            w.add_tensor(name, x)
        elif qtype == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        elif qtype == T.Q8_0:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            # Q4_K has no quantizer in gguf: random bytes make valid blocks except for the two
            # f16 scales of each block, which are set to small finite values
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, size=(shape[0], shape[1] // block, type_size), dtype=np.uint8)
            raw[:, :, 0:4] = np.frombuffer(np.array([0.01, 0.001], dtype=np.float16).tobytes(), np.uint8)
            w.add_tensor(name, raw.reshape(shape[0], -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def layout(path: str | Path) -> dict:
    """Offsets of the parts of a valid file, read with gguf.GGUFReader (independent of minfer).

    kv: key -> offset where its entry starts; tensor_info: name -> offset of its entry;
    tensor_info_end: where the tensor-info table ends; data: name -> (abs offset, n_bytes);
    and for each tensor the absolute offsets of its n_dims, ne[0], type and offset fields.
    """
    r = gguf.GGUFReader(str(path))
    out: dict = {"kv": {}, "tensor_info": {}, "data": {}, "n_dims_at": {}, "ne0_at": {},
                 "type_at": {}, "offset_at": {}}
    for name, f in r.fields.items():
        if not name.startswith("GGUF."):
            out["kv"][name] = f.offset
    end = 0
    for t in r.tensors:
        f = t.field
        at = f.offset + 8 + len(t.name.encode())
        out["tensor_info"][t.name] = f.offset
        out["n_dims_at"][t.name] = at
        out["ne0_at"][t.name] = at + 4
        out["type_at"][t.name] = at + 4 + 8 * len(t.shape)
        out["offset_at"][t.name] = at + 4 + 8 * len(t.shape) + 4
        end = max(end, out["offset_at"][t.name] + 8)
        out["data"][t.name] = (int(t.data_offset), int(t.n_bytes))
    out["tensor_info_end"] = end
    out["data_start"] = int(r.data_offset)
    out["alignment"] = int(r.alignment)
    return out
