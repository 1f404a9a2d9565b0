"""Qwen3 (dense): the GGUF arch `qwen3`.

The llama computation (minfer/models/llama.py) with these differences (llama.cpp
src/models/qwen3.cpp, convert_hf_to_gguf.py Qwen3Model):
- each head of q and of k is RMS-normalized before rope, with weights
  blk.N.attn_q_norm.weight and blk.N.attn_k_norm.weight, both (head_dim,), eps = the model's
  rms eps (HF Qwen3Attention: q_norm / k_norm on the (.., head_dim) view);
- no q/k/v biases (Qwen2 had them);
- head_dim comes from `qwen3.attention.key_length` (128 for every Qwen3 size), so
  n_heads * head_dim may differ from the embedding length (Qwen3-0.6B: 16 x 128 vs 1024);
- RoPE in ggml NEOX mode (llama_model_rope_type: LLM_ARCH_QWEN3 -> NEOX); q/k unpermuted.
The q/k norm itself lives in the shared attention branch (models/layers.py, `qk_norm`).

Qwen3-Reranker (a decoder reranker; also Qwen3-VL-Reranker through models/qwen3vl.py, which
inherits this loader): llama.cpp's converter (conversion/qwen.py Qwen3Model: _is_qwen3_reranker,
set_gguf_parameters, _get_cls_out_tensor, modify_tensors) writes
- `qwen3.pooling_type` = 4 (RANK) and `qwen3.classifier.output_labels` ["yes", "no"];
- a chat template named "rerank" (`tokenizer.chat_template.rerank`, listed in
  `tokenizer.chat_templates`) with {query} and {document} placeholders, which llama-server fills in
  and tokenizes with special texts parsed and no BOS/EOS added (tools/server/server-common.cpp
  format_prompt_rerank; runtime/embed.py pair_ids);
- `cls.output.weight` (2, D): the lm head's rows of "yes" then "no". An untied model's lm_head is
  then NOT written (only those two rows: the file has no `output.weight`, and its tied fallback,
  token_embd, is not the model's lm head: such a file reranks, it does not generate as trained).
The loader (src/models/qwen3.cpp load_arch_tensors) creates `cls.output.weight` optionally, of
n_cls_out rows of D; it is read here into `rank_head` (models/bert.py load_rank_head / RankHead; None
without one). Pooling 'rank' then takes the hidden row after the output norm of the LAST token
(llm_graph_input_cls::set_input: RANK with causal attention picks the largest position), applies
cls.output, and a softmax over the outputs (llama-graph.cpp build_pooling: "softmax for qwen3
reranker", arch QWEN3 / QWEN3VL): llama-server's relevance score, element 0 (send_rerank), is the
probability of "yes" against "no".
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.models.bert import RankHead, load_rank_head
from minfer.models.llama import LlamaModel


class Qwen3Model(LlamaModel):
    arch = "qwen3"
    rope_style = "neox"
    qk_norm = True
    rank_head: RankHead | None = None     # a reranker's head (module doc), run by pooling 'rank'

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Qwen3Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        model = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        model.rank_head = load_rank_head(gf, cfg.d_model, cfg.arch)
        return model
