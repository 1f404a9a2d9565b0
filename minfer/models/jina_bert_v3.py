"""Jina embeddings v3 encoders (jinaai/jina-embeddings-v3: XLM-RoBERTa with rotary positions; transformers'
JinaEmbeddingsV3Model): the GGUF arch `jina-bert-v3`. An encoder for embeddings only: BERT's post-norm layers
(minfer/models/bert.py) with rope instead of a position table, BERT's GELU MLP with biases:

    x_0 = LN(E[tokens] + T[0]; token_embd_norm)                  no position table
    for each layer l:
        q, k, v = split(W_qkv x + b_qkv)                           rope (NEOX, base 20000 in the real model) on q, k
        x = LN(x + W_o attn(q, k, v) + b_o; attn_output_norm)      attention over ALL tokens (bidirectional)
        x = LN(x + W_down gelu(W_up x + b_up) + b_down; layer_output_norm)
    hidden = x                                                     pooled by the file's pooling (MEAN in the real one)

Each rule and its source (llama.cpp src/models/jina-bert-v3.cpp load_arch_hparams / load_arch_tensors; the graph is
bert's: src/models/bert.cpp llama_model_bert::graph; src/llama-model.cpp llama_model_rope_type, create_memory,
create_tensor_qkv; src/llama-graph.cpp build_qkv, build_attn_inp_no_cache, build_ffn, build_pooling;
conversion/bert.py XLMRobertaModel; transformers models/jina_embeddings_v3/modeling_jina_embeddings_v3.py):
- What jina-bert-v3 changes from XLM-R (which runs as arch `bert`, models/bert.py): NO learned position table
  (bert.cpp adds pos_embd only for LLM_ARCH_BERT; jina-bert-v3.cpp creates none; the converter writes none since
  the checkpoint has none) but RoPE on q and k at positions 0..T-1 (bert.cpp's rope branch: `model.arch ==
  LLM_ARCH_NOMIC_BERT || ... || model.arch == LLM_ARCH_JINA_BERT_V3`, ggml_rope_ext with inp_pos). Positions count
  from 0 (llama.cpp's inp_pos; transformers' position_ids = arange(T)), not from pad_token_id + 1 as XLM-R's table
  (the converter still cuts context_length to max_position_embeddings - 2; no table, so nothing bounds the context
  but llama.cpp's warning). Everything else is XLM-R's: token type row 0, LayerNorm'd input, post-norm, GELU MLP.
- RoPE: NEOX pairs (x[i], x[i + n_rot/2]) (llama_model_rope_type lists LLM_ARCH_JINA_BERT_V3 with the archs whose
  "pairs of head values are offset by n_rot/2"; transformers' rotate_half), base `jina-bert-v3.rope.freq_base`
  (the converter's find_hparam(["rope_theta", "rotary_emb_base"]): jina-embeddings-v3's rotary_emb_base 20000),
  n_rot `rope.dimension_count` (default the head size), no scaling.
- The input: the token's row plus row 0 of the optional `token_types.weight` (TENSOR_NOT_REQUIRED; bert.cpp "token
  types are hardcoded to zero"), then LayerNorm with weight and bias (token_embd_norm, required; the converter maps
  jinaai's roberta.emb_ln there). `tokenizer.ggml.token_type_count` must be > 0 (load_arch_tensors: "model needs
  to define token type count").
- q/k/v: create_tensor_qkv takes the fused `attn_qkv` (3D, D) with its optional bias (what the converter writes
  from jinaai's mixer.Wqkv) or separate attn_q / attn_k / attn_v; build_qkv splits the fused rows q, k, v.
  attn_output (D, D) with an optional bias (mixer.out_proj). No q/k norms, no attn_norm_2 (not created).
- Attention: softmax(q k^T / sqrt(head_dim)) v over every key (build_attn_inp_no_cache; the converter writes
  attention.causal false), no KV cache (create_memory: none for JINA_BERT_V3): the input is ONE forward from 0.
- Post-norm residuals: LN(x + attention; attn_output_norm = jinaai norm1 / HF post_attention_layernorm), then
  LN(that + MLP; layer_output_norm = norm2 / post_mlp_layernorm); LayerNorms with weight and bias, eps
  `jina-bert-v3.attention.layer_norm_epsilon` (load_arch_hparams, required).
- The MLP is not gated: bert.cpp's `LLM_ARCH_BERT || NOMIC_BERT_MOE || JINA_BERT_V3` branch, build_ffn(ffn_up,
  ffn_up_b, ffn_down, ffn_down_b, LLM_FFN_GELU, LLM_FFN_SEQ) = W_down gelu(W_up x + b_up) + b_down (biases
  optional), GELU's tanh form (ggml_gelu; on llama.cpp's CPU a float16 table), where the model's hidden_act "gelu"
  is the exact erf (transformers' ACT2FN): ~3e-4 of the largest hidden value apart on the fixture. minfer follows
  llama.cpp (BertModel.mlp).
- The last layer's adds, norms and MLP on the output rows only (inp_out_ids); the rows after the last
  layer_output_norm are the embeddings (res->t_embd), pooled by build_pooling with `jina-bert-v3.pooling_type`
  (the converter's _try_set_pooling_type: MEAN from the sentence-transformers Pooling module) or the caller's.
  No lm head: BertModel.head refuses generation. No classifier: the loader creates no cls tensors.
- The task LoRA adapters (retrieval.query / retrieval.passage / separation / classification / text-matching): the
  converter (XLMRobertaModel.modify_tensors) writes the BASE weights only into the model file and every
  `.0.lora_A` / `.0.lora_B` into one separate LoRA GGUF per task (`lora-<task>-<name>.gguf`, general.type adapter,
  adapter.lora.alpha / task_name / prompt_prefix), which llama.cpp applies with --lora. minfer runs the base model
  without an adapter (what transformers' JinaEmbeddingsV3Model computes, and llama.cpp without --lora); an
  adapter file is refused by name, and so is any tensor the loader would not create (llama.cpp: "wrong number of
  tensors"). The task prompt prefixes are the caller's to prepend.
- The tokenizer is XLM-R's Unigram (tokenizer.ggml.model t5, minfer/tokenizer/ugm.py) with <s> A </s>; for this
  arch llama.cpp gives `<mask>` LSTRIP (minfer/tokenizer/vocab.py, as llama-vocab.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.bert import BertModel
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertBlock, NomicBertModel, qkv_tensors
from minfer.weights import QWeight


@dataclass
class JinaBertV3Block(NomicBertBlock):
    """nomic-bert's block without the gate: ffn_up (F, D) + bias, ffn_down (D, F) + bias (ffn_gate None)."""

    def matrices(self) -> list[QWeight]:
        qkv = [self.attn_qkv] if self.attn_qkv is not None else [self.attn_q, self.attn_k, self.attn_v]
        return qkv + [self.attn_output, self.ffn_up, self.ffn_down]


class JinaBertV3Model(NomicBertModel):
    """NomicBertModel's pieces (token type row, LayerNorm'd input, fused q/k/v, NEOX rope + bidirectional attention,
    post-norm forward, the encoder's step check, BertModel.head's refusal of generation) with BERT's GELU MLP and
    its biases (module doc)."""

    arch = "jina-bert-v3"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_JINA_BERT_V3 -> NEOX (applied: bert.cpp's rope branch)

    mlp = BertModel.mlp       # bert.cpp: W_down gelu_tanh(W_up h + b_up) + b_down (LLM_FFN_GELU, LLM_FFN_SEQ)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "JinaBertV3Model":
        if gf.metadata.get("general.type") == "adapter":
            raise MinferError(f"{gf.path}: a LoRA adapter file (general.type adapter, task "
                              f"{gf.metadata.get('adapter.lora.task_name')!r}), not a model: minfer runs the "
                              f"{cls.arch} base model only; load the model file itself (adapters are not applied)")
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_tensor_names(gf, cfg)
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor llama.cpp's jina-bert-v3 loader would not create (module doc)."""
        known = {"token_embd.weight", "token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias"}
        for i in range(cfg.n_layers):
            known |= {f"blk.{i}.{n}.{s}" for n in ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "attn_output_norm", "ffn_up", "ffn_down", "layer_output_norm")
                      for s in ("weight", "bias")}
        for name in gf.tensors:
            if name not in known:
                why = (" (a LoRA tensor: the converter writes the task adapters as separate files; minfer runs the "
                       "base model only)" if "lora" in name else "")
                raise MinferError(f"{gf.path}: tensor '{name}' is not part of a {cls.arch} model{why} (llama.cpp's "
                                  "loader refuses the file too: src/models/jina-bert-v3.cpp creates no such tensor)")

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> "JinaBertV3Block":
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw = t.w, t.v, t.opt, t.D, t.F
        return JinaBertV3Block(
            **qkv_tensors(t),
            attn_output=w("attn_output", (D, D)), attn_output_b=opt("attn_output.bias", D),
            attn_output_norm=v("attn_output_norm.weight", D), attn_output_norm_b=v("attn_output_norm.bias", D),
            ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=opt("ffn_up.bias", Fw), ffn_gate=None,
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=opt("ffn_down.bias", D),
            layer_output_norm=v("layer_output_norm.weight", D), layer_output_norm_b=v("layer_output_norm.bias", D))
