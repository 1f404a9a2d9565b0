"""Bidirectional Llama embedding models (NVIDIA llama-embed-nemotron-8b, llama-nemotron-embed-1b-v2: HF
LlamaBidirectionalModel): the GGUF arch `llama-embed`. Llama's layers with attention over the whole input, for
embeddings only:

    x_0 = E[tokens]                                              token_embd (V, D); no position table
    for each layer l:
        h = RMSNorm(x; attn_norm)
        q, k, v = W_q h, W_k h, W_v h                              rope (NORM, adjacent pairs) on q and k
        x = x + W_o attn(q, k, v)                                  attention over ALL tokens (bidirectional), GQA
        x = x + W_down (silu(W_gate RMSNorm(x; ffn_norm)) * W_up RMSNorm(x; ffn_norm))
    hidden = RMSNorm(x; output_norm)                               the rows an embeddings run pools

That is eurobert's shape (models/eurobert.py) with llama's rope pairs, so this class is EuroBertModel with the rules
below changed. Each rule and its source (llama.cpp src/models/models.h llama_model_llama_embed, src/models/llama-embed.cpp,
src/models/llama.cpp; src/llama-model.cpp load_hparams, llama_model_rope_type, create_memory; src/llama-context.cpp;
src/llama-graph.cpp build_pooling; conversion/llama.py LlamaEmbedNemotronModel / LlamaModel; conversion/base.py):
- llama_model_llama_embed is llama_model_llama with its load_arch_hparams and load_arch_tensors ("reuse
  load_arch_hparams and load_arch_tensors from llama_model_llama"); its graph is llama's graph<true> (embed): the
  attention input is build_attn_inp_no_cache (no KV cache is read or written) and no lm head is built (t_embd is
  the output_norm row; `if constexpr (!embed)` skips build_lora_mm(model.output)).
- Causal or not: llama's load_arch_hparams sets nothing; hparams.causal_attn is the general
  `llama-embed.attention.causal` key, default TRUE (load_hparams: get_key(LLM_KV_ATTENTION_CAUSAL, ..., false)), and
  the no-cache mask follows cparams.causal_attn (= hparams.causal_attn unless the caller sets attention_type). The
  converter writes the key false only when the HF config says is_causal: false (TextModel.set_gguf_parameters).
  So llama.cpp runs a file WITHOUT the key causally (the fixture goldens' absent_causal_key rows are transformers'
  causal rows): minfer runs llama-embed files with attention.causal false only and refuses the others by name
  (config.py: Model.causal False with causal_key_default left true), rather than give either reading silently.
- RoPE: llama_model_rope_type lists LLM_ARCH_LLAMA_EMBED with the NORM archs (adjacent pairs); the converter is a
  LlamaModel (undo_permute True) and permutes attn_q / attn_k rows (LlamaModel.permute) so NORM pairs equal HF's
  rotate_half on the original weights. n_rot must be the head size (load_hparams: "invalid n_rot" for
  LLM_ARCH_LLAMA_EMBED; graph: GGML_ASSERT(n_embd_head == n_rot)). llama3 rope scaling comes as the per-frequency
  divisor tensor rope_freqs.weight (LlamaModel.generate_extra_tensors; llama-embed-nemotron-8b is a Llama-3.1-8B),
  read by config.py into cfg.rope; linear / yarn scaling keys as for llama.
- Attention scale 1/sqrt(head size) (f_attention_scale is not read for llama: 0 -> 1/sqrt(n_embd_head)); no q/k
  norms (use_kq_norm false); grouped kv heads (q head h reads kv head h // (H / Hkv)).
- Tensors (llama's load_arch_tensors): token_embd, output_norm, optional output (an lm head: the converted
  LlamaBidirectionalModel has none; llama.cpp creates it but the embed graph never reads it, so it is accepted and
  not loaded), optional rope_freqs; per layer attn_norm, attn_q / attn_k / attn_v or fused attn_qkv with optional
  biases (create_tensor_qkv), attn_output, ffn_norm, ffn_gate / ffn_up / ffn_down. Not run here (refused by name;
  no llama-embed release has them): the optional attn_output / MLP biases and the MoE experts (n_expert > 0) that
  llama's loader would also take.
- Pooling: the converter does not call _try_set_pooling_type for LlamaModel, so a converted file carries no
  `llama-embed.pooling_type` (llama.cpp: LLAMA_POOLING_TYPE_UNSPECIFIED -> NONE, per-token rows) whatever the
  checkpoint's sentence-transformers modules say; llama-embed-nemotron-8b pools by the mean ("pooling": "avg"): pass
  pooling="mean" (minfer asks for a pooling when the file names none: runtime/embed.py pooling_of). The CLS row is
  the first token (the smallest position of a non-causal model), LAST the last one (build_pooling).
- The tokenizer is what LlamaModel.set_vocab writes (sentencepiece, or a byte-level BPE `gpt2` for Llama 3); minfer's
  tokenizer follows the file's keys (add_bos / add_eos) as llama.cpp's does.
- create_memory makes llama.cpp a KV cache for LLAMA_EMBED that graph<true> never uses; here there is none: the
  whole input is one forward from position 0 (runtime/embed.py, Model.causal False), and generation is refused
  (BertModel.head).
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.eurobert import EuroBertModel


class LlamaEmbedModel(EuroBertModel):
    """EuroBertModel's bidirectional llama-shaped encoder with llama's NORM rope and llama's tensor set (module doc)."""

    arch = "llama-embed"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_LLAMA_EMBED -> NORM (the converter permuted q/k)
    norm_eps_key = "attention.layer_norm_rms_epsilon"    # llama.cpp load_arch_hparams (required)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "LlamaEmbedModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        arch, D = cls.arch, cfg.d_model
        dv = gf.metadata.get(f"{arch}.attention.value_length", cfg.head_dim)
        if dv != cfg.head_dim:
            raise MinferError(f"{gf.path}: {arch}.attention.value_length {dv} != key_length {cfg.head_dim} (llama.cpp's "
                              "llama graph: GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()))")
        if cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: minfer runs {arch} with head_count * head size == embedding_length only "
                              f"(llama's loader also takes other head sizes; no llama-embed model has one): got "
                              f"{cfg.n_heads} x {cfg.head_dim} != {D}")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head size "
                              f"{cfg.head_dim} (llama.cpp load_hparams: invalid n_rot for llama-embed)")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor that is neither llama's (load_arch_tensors) nor run here (module doc)."""
        known = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
        for i in range(cfg.n_layers):
            known |= {f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_qkv",
                                                      "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
            known |= {f"blk.{i}.{n}.bias" for n in ("attn_q", "attn_k", "attn_v", "attn_qkv")}
        for name in gf.tensors:
            if name not in known:
                raise MinferError(f"{gf.path}: tensor '{name}' is not run by minfer's {cls.arch} (llama's loader "
                                  "takes optional attn_output / MLP biases and MoE experts, which no llama-embed "
                                  "model has; any other name it refuses too)")
