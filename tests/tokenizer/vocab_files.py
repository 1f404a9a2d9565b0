"""Small GGUF files that carry a real vocab under another tokenizer.ggml.pre.

The catalog models use the qwen2 and smollm pre-tokenizers; to test the llama3
('llama-bpe') and GPT-2 ('gpt-2') rules against llama.cpp too, SmolLM2's byte-level vocab
and merges are written into a vocab-only GGUF with a different pre value. Both
tools/gen_token_goldens.py (for llama.cpp) and the tests (for minfer) build the file with
this function, so they read the same bytes.
"""

from __future__ import annotations

from pathlib import Path

VARIANT_PRES = {"smollm2-as-llama-bpe": "llama-bpe", "smollm2-as-gpt-2": "gpt-2"}
# tokenizer.ggml.add_space_prefix = true on the gpt-2 variant: llama.cpp's BPE ignores it
# when encoding but strips one leading space of the first token when decoding
ADD_SPACE_PREFIX = {"gpt-2"}
BASE_MODEL = "smollm2-135m-instruct"


def write_vocab_variant(base_metadata: dict, pre: str, out: Path) -> Path:
    """A vocab-only GGUF (arch llama, no tensors) with the base tokenizer and `pre`."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    # the hyper-parameters llama.cpp's loader reads before it reaches the vocab
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(base_metadata["tokenizer.ggml.tokens"])
    w.add_token_types(base_metadata["tokenizer.ggml.token_type"])
    w.add_token_merges(base_metadata["tokenizer.ggml.merges"])
    w.add_bos_token_id(int(base_metadata["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(base_metadata["tokenizer.ggml.eos_token_id"]))
    if pre in ADD_SPACE_PREFIX:
        w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
