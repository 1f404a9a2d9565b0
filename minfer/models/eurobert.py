"""EuroBERT encoders (EuroBERT-210m / 610m / 2.1B: HF EuroBertModel): the GGUF arch `eurobert`. An encoder for
embeddings only, built like llama (RMSNorm pre-norm layers, rope, SwiGLU, grouped kv heads) but with attention
over the whole input:

    x_0 = E[tokens]                                              token_embd (V, D); no position table, no types
    for each layer l:
        h = RMSNorm(x; attn_norm)
        q, k, v = W_q h, W_k h, W_v h                              rope (NEOX) on q and k at positions 0..T-1
        x = x + W_o attn(q, k, v)                                  attention over ALL tokens (bidirectional), GQA
        x = x + W_down (silu(W_gate RMSNorm(x; ffn_norm)) * W_up RMSNorm(x; ffn_norm))
    hidden = RMSNorm(x; output_norm)                               the rows an embeddings run pools

Each rule and its source (llama.cpp src/models/eurobert.cpp load_arch_hparams / load_arch_tensors / graph;
src/llama-model.cpp llama_model_rope_type, create_tensor_qkv, create_memory; src/llama-graph.cpp build_qkv,
build_attn_inp_no_cache, build_ffn, build_pooling; conversion/bert.py EuroBertModel; HF modeling_eurobert):
- The input: the token's row only (build_inp_embd(tok_embd)); no position table, no token types, no input norm.
- Every norm is an RMSNorm with a weight and no bias (build_norm(..., NULL, LLM_NORM_RMS)), eps
  `eurobert.attention.layer_norm_rms_epsilon` (load_arch_hparams: get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS),
  required; the converter writes HF's rms_norm_eps there).
- Tensors (load_arch_tensors): token_embd, output_norm.weight; per layer attn_norm.weight, attn_q (D, D) /
  attn_k / attn_v (Hkv * Dh, D) or a fused attn_qkv, with optional q/k/v biases (create_tensor_qkv; build_qkv splits
  the fused rows q, k, v), attn_output (D, D) without a bias, ffn_norm.weight, ffn_gate / ffn_up (F, D), ffn_down
  (D, F), no MLP biases. Nothing else: llama.cpp's loader fails a file with a tensor it did not create ("wrong
  number of tensors"; HF attention_bias / mlp_bias true would give attn_output / MLP biases, an lm head would give
  output.weight); here any other tensor is refused by name. n_head * head size must be D (attn_q and attn_output
  are created (D, D)), and key / value head sizes equal (the graph's GGML_ASSERT).
- Pre-norm residuals, llama's: x + W_o attn(RMSNorm(x; attn_norm)), then (that) + MLP(RMSNorm(that; ffn_norm));
  the last layer's adds and MLP on the output rows only (inp_out_ids), then output_norm gives the embeddings
  (res->t_embd after build_norm(output_norm)): HF's last_hidden_state, after its final `norm`, is the same row.
- RoPE on q and k, NEOX pairs (x[i], x[i + n_rot/2]): llama_model_rope_type lists LLM_ARCH_EUROBERT with the
  archs whose "pairs of head values are offset by n_rot/2" (HF rotate_half on the weights as released; the
  converter (a TextModel, not LlamaModel) does not permute attn_q / attn_k). Base `eurobert.rope.freq_base` (HF
  rope_theta), n_rot `rope.dimension_count` (default the head size); rope.scaling.type none.
- Attention: softmax(q k^T / sqrt(head_dim)) v over every key (build_attn_inp_no_cache with causal_attn false: the
  converter writes `eurobert.attention.causal` false; HF is_causal False with a bidirectional mask), grouped kv
  heads: q head h reads kv head h // (H / Hkv) (ggml's broadcast in build_attn_mha; HF repeat_kv). No KV cache
  (create_memory: none for EUROBERT), so the whole input is ONE forward from position 0 (runtime/embed.py runs a
  non-causal model's input as one chunk).
- The MLP is SwiGLU without biases: build_ffn(up, gate, down, LLM_FFN_SILU, LLM_FFN_PAR) = W_down (silu(W_gate h) *
  W_up h) (HF EuroBertMLP with hidden_act silu; another hidden_act is not what llama.cpp computes and the converter
  does not write it: EuroBERT's are silu).
- Pooling: build_pooling on those rows by `eurobert.pooling_type` (the converter's _try_set_pooling_type, from a
  sentence-transformers Pooling module when the model directory has one) or the caller's; llama.cpp's CLS row is the
  first token (the smallest position of a non-causal model), LAST the last one.
- The tokenizer the converter writes is the byte-level BPE `gpt2` model (set_vocab: _set_vocab_gpt2); it asks
  add_bos_token false first, but gguf-py's SpecialVocab then writes the HF tokenizer's own add_bos / add_eos (read
  from its post-processor) over it, and that value is what the file carries (the fixture's: true and true, from a
  <s> ... </s> template); minfer's tokenizer follows the file's keys, as llama.cpp's does.
- No lm head (EuroBertForMaskedLM's is not converted): BertModel.head refuses generation; no classifier head.
- The context may go past `context_length` (no position table bounds it; llama.cpp warns only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.bert import bidirectional_attention
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertModel, qkv_tensors
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class EuroBertBlock:
    attn_norm: torch.Tensor                  # (D,)
    attn_q: QWeight | None                   # (D, D); None with a fused attn_qkv
    attn_k: QWeight | None                   # (Hkv*Dh, D)
    attn_v: QWeight | None                   # (Hkv*Dh, D)
    attn_q_b: torch.Tensor | None
    attn_k_b: torch.Tensor | None
    attn_v_b: torch.Tensor | None
    attn_output: QWeight                     # (D, D), no bias
    ffn_norm: torch.Tensor                   # (D,)
    ffn_gate: QWeight                        # (F, D)
    ffn_up: QWeight                          # (F, D)
    ffn_down: QWeight                        # (D, F)
    attn_qkv: QWeight | None = None          # (D + 2 Hkv*Dh, D): q, k, v rows
    attn_qkv_b: torch.Tensor | None = None
    attn_output_b: torch.Tensor | None = None   # never in a eurobert file (NomicBertModel.attention reads it)

    def matrices(self) -> list[QWeight]:
        qkv = [self.attn_qkv] if self.attn_qkv is not None else [self.attn_q, self.attn_k, self.attn_v]
        return qkv + [self.attn_output, self.ffn_gate, self.ffn_up, self.ffn_down]


class EuroBertModel(NomicBertModel):
    """NomicBertModel's pieces (the q/k/v split, rope + bidirectional attention, the bias-free SwiGLU, the encoder's
    step check, BertModel.head's refusal of generation) in llama's pre-norm RMSNorm layout (module doc)."""

    arch = "eurobert"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_EUROBERT -> NEOX
    norm_eps_key = "attention.layer_norm_rms_epsilon"    # eurobert.cpp load_arch_hparams

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, output_norm: torch.Tensor,
                 blocks: list[EuroBertBlock], act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.act_dtype = act_dtype
        self.token_embd = token_embd          # (V, D)
        self.position_embd = None             # rotary positions: no table
        self.type_row = None                  # no token types
        self.embd_norm = self.embd_norm_b = None
        self.output_norm = output_norm        # (D,)
        self.blocks = blocks
        self.rank_head = None                 # eurobert.cpp creates no classifier head

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "EuroBertModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, arch = cfg.vocab, cfg.d_model, cls.arch
        if cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: {arch} needs head_count * head size == embedding_length (attn_q and "
                              f"attn_output are ({D}, {D})); got {cfg.n_heads} x {cfg.head_dim} != {D}")
        dv = gf.metadata.get(f"{arch}.attention.value_length", cfg.head_dim)
        if dv != cfg.head_dim:
            raise MinferError(f"{gf.path}: {arch}.attention.value_length {dv} != key_length {cfg.head_dim} "
                              "(eurobert.cpp: GGML_ASSERT(n_embd_head == n_embd_head_k))")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {arch}.feed_forward_length is {cfg.ffn}: expected > 0")
        cls.check_tensor_names(gf, cfg)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        blocks = []
        for i in range(cfg.n_layers):
            t = BlockTensors(gf, cfg, i, device, dtype)
            blocks.append(EuroBertBlock(
                attn_norm=t.v("attn_norm.weight", D), **qkv_tensors(t), attn_output=t.w("attn_output", (D, D)),
                ffn_norm=t.v("ffn_norm.weight", D), ffn_gate=t.w("ffn_gate", (t.F, D)),
                ffn_up=t.w("ffn_up", (t.F, D)), ffn_down=t.w("ffn_down", (D, t.F))))
        return cls(cfg, token_embd, output_norm, blocks, act_dtype=act_dtype)

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor llama.cpp's eurobert loader would not create (module doc)."""
        known = {"token_embd.weight", "output_norm.weight"}
        for i in range(cfg.n_layers):
            known |= {f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_qkv",
                                                      "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
            known |= {f"blk.{i}.{n}.bias" for n in ("attn_q", "attn_k", "attn_v", "attn_qkv")}
        for name in gf.tensors:
            if name not in known:
                raise MinferError(f"{gf.path}: tensor '{name}' is not part of a {cls.arch} model (llama.cpp's loader "
                                  "refuses the file too: src/models/eurobert.cpp creates no such tensor)")

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: EuroBertBlock, ctx, positions: torch.Tensor | None = None,
                  rope=None, window: int = 0) -> torch.Tensor:
        """h (T, D) -> W_o attn(rope(q), rope(k), v) (T, D) over every row of h, grouped kv heads repeated
        (bert.bidirectional_attention); NomicBertModel.attention's rule, written out for the GQA shapes."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = self.qkv(h, blk, ctx)
        if positions is None:
            positions = torch.arange(T, device=h.device)
        q = ops.rope(q.reshape(T, H, Dh), positions, c.rope)
        k = ops.rope(k.reshape(T, Hkv, Dh), positions, c.rope)
        o = bidirectional_attention(q, k, v.reshape(T, Hkv, Dh), Dh ** -0.5)
        return ops.linear(o, blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) at positions 0..T-1 -> the hidden rows step.logits names (after output_norm), handed to an
        embeddings run (Model.head); the cache is not used. x: the float32 residual stream; h: its RMSNorm in the
        matmuls' dtype (each residual add with the norm after it: ops.add_rms_norm, as llama's forward). Also
        models/t5encoder.py's forward, with its own attention and mlp."""
        self.check_step(step, cache)
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd).float()                 # (T, D)
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        last = len(blocks) - 1
        for i, blk in enumerate(blocks):
            a = self.attention(h, blk, ctx, step.positions)
            if i == last:     # eurobert.cpp: the last layer's adds and MLP on the output rows only (inp_out_ids)
                x, a = step.rows(x), step.rows(a)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            f = self.mlp(h, blk, ctx)
            nxt = blocks[i + 1].attn_norm if i < last else self.output_norm
            x, h = ops.add_rms_norm(x, f, nxt, eps, act, ctx)
        return self.head(h, ctx)
