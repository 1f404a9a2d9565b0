"""Nomic BERT encoders (nomic-embed-text-v1 / v1.5: HF NomicBertModel): the GGUF arch `nomic-bert`. An encoder for
embeddings only, BERT's post-norm layers (minfer/models/bert.py) with rotary positions and a SwiGLU MLP:

    x_0 = LN(E[tokens] + T[0]; token_embd_norm)                  no position table
    for each layer l:
        q, k, v = split(W_qkv x)  (or W_q x, W_k x, W_v x)       rope (NEOX) on q and k at positions 0..T-1
        x = LN(x + W_o attn(q, k, v) + b_o; attn_output_norm)      attention over ALL tokens (bidirectional)
        x = LN(x + W_down (silu(W_gate x) * W_up x); layer_output_norm)
    hidden = x

Each rule and its source (llama.cpp src/models/nomic-bert.cpp load_arch_hparams / load_arch_tensors; the graph is
bert's: src/models/models.h `llama_model_nomic_bert::graph = llama_model_bert::graph`, src/models/bert.cpp;
src/llama-model.cpp create_tensor_qkv, llama_model_rope_type, create_memory; src/llama-graph.cpp build_qkv,
build_ffn; conversion/bert.py NomicBertModel; HF modeling_nomic_bert):
- The input: the token's row plus row 0 of the optional `token_types.weight` (bert.cpp "token types are hardcoded
  to zero"), then LayerNorm with weight and bias (token_embd_norm, both required). No learned positions: bert.cpp
  adds pos_embd only for LLM_ARCH_BERT, and nomic-bert.cpp creates none. `tokenizer.ggml.token_type_count` must be
  > 0 (load_arch_tensors: "model needs to define token type count").
- q/k/v: a fused `attn_qkv` (3D, D) (what the converter writes from HF's Wqkv) with an optional fused bias, or
  separate attn_q / attn_k / attn_v with optional biases (create_tensor_qkv takes either; build_qkv splits the fused
  rows q, k, v in that order). attn_output (D, D) with an optional bias.
- RoPE on q and k (bert.cpp: `model.arch == LLM_ARCH_NOMIC_BERT` -> ggml_rope_ext with inp_pos), NEOX pairs
  (llama_model_rope_type: LLM_ARCH_NOMIC_BERT -> NEOX; HF rotate_half), base `nomic-bert.rope.freq_base` (converter:
  rotary_emb_base, 1000 for nomic-embed), n_rot `rope.dimension_count` (default the head size; the converter asserts
  rotary_emb_fraction 1.0). Scale 1/sqrt(head_dim), softmax over every key (build_attn_inp_no_cache, causal_attn
  false: the converter writes attention.causal false), no KV cache (create_memory: none for NOMIC_BERT).
- Post-norm residuals as bert: LN(x + attention; attn_output_norm), LN(that + MLP; layer_output_norm), LayerNorms
  with weight and bias, eps `nomic-bert.attention.layer_norm_epsilon` (load_arch_hparams).
- The MLP is SwiGLU, not bert's GELU: bert.cpp's last build_ffn branch (neither BERT nor NOMIC_BERT_MOE nor JINA):
  ffn_up, ffn_gate (required: load_arch_tensors flag 0), ffn_down, LLM_FFN_SILU, LLM_FFN_PAR ->
  W_down (silu(W_gate x) * W_up x); HF NomicBertMLP down_proj(act(gate_proj x) * up_proj x), with the converter's
  fc11 -> ffn_up, fc12 -> ffn_gate (gguf-py tensor_mapping). That branch passes NULL for every MLP bias: llama.cpp
  loads ffn_up.bias / ffn_down.bias (TENSOR_NOT_REQUIRED) and never adds them, while HF (mlp_fc1_bias /
  mlp_fc2_bias) would; the converter asserts they are absent, so a file with them is refused here by name rather
  than run one way or the other. SiLU is computed exactly by both (no approximation).
- The last layer's adds, norms and MLP on the output rows only (bert.cpp inp_out_ids); the rows after the last
  layer_output_norm are the embeddings (res->t_embd). No lm head (BertModel.head refuses generation).
- The context may go past `context_length` (no position table bounds it; llama.cpp warns only).
- The MoE variant (nomic-embed-text-v2-moe, arch `nomic-bert-moe`) is another architecture: models/nomic_bert_moe.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.bert import BertBlock, BertModel, bidirectional_attention
from minfer.models.layers import BlockTensors
from minfer.weights import QWeight, load_dense, load_qweight, load_vector


@dataclass
class NomicBertBlock(BertBlock):
    attn_qkv: QWeight | None = None          # (3D, D): q, k, v rows; None with separate attn_q / attn_k / attn_v
    attn_qkv_b: torch.Tensor | None = None
    ffn_gate: QWeight | None = None          # (F, D)

    def matrices(self) -> list[QWeight]:
        qkv = [self.attn_qkv] if self.attn_qkv is not None else [self.attn_q, self.attn_k, self.attn_v]
        return qkv + [self.attn_output, self.ffn_up, self.ffn_gate, self.ffn_down]


def token_type_row(gf, D: int, device, arch: str) -> torch.Tensor | None:
    """Row 0 of `token_types.weight` (float32) or None without it; MinferError for a missing or non-positive
    `tokenizer.ggml.token_type_count` or a misshaped table (load_arch_tensors, as bert's)."""
    n_types = gf.metadata.get("tokenizer.ggml.token_type_count")
    if not isinstance(n_types, int) or isinstance(n_types, bool) or n_types <= 0:
        raise MinferError(f"{gf.path}: metadata key 'tokenizer.ggml.token_type_count' is "
                          f"{'missing' if n_types is None else repr(n_types)[:40]}: {arch} needs the count of token "
                          "types (llama.cpp's loader refuses the file too)")
    if "token_types.weight" not in gf.tensors:
        return None
    t = gf.tensor("token_types.weight")
    if tuple(t.shape) != (n_types, D):
        raise MinferError(f"{gf.path}: tensor 'token_types.weight' has shape {tuple(t.shape)}, expected "
                          f"({n_types}, {D}) (tokenizer.ggml.token_type_count, embedding_length)")
    return load_dense(gf, "token_types.weight")[0].float().to(device)


def qkv_tensors(t: BlockTensors) -> dict:
    """Layer t's attention inputs as NomicBertBlock keyword arguments: the fused attn_qkv (3D, D) with its optional
    bias (or separate q/k/v biases, concatenated: build_qkv), else attn_q / attn_k / attn_v with optional biases
    (create_tensor_qkv takes either)."""
    w, opt, D, kv_out = t.w, t.opt, t.D, t.kv_out
    qkv = dict(attn_q=None, attn_k=None, attn_v=None, attn_q_b=None, attn_k_b=None, attn_v_b=None)
    if t.has("attn_qkv.weight"):
        n = D + 2 * kv_out
        qkv.update(attn_qkv=w("attn_qkv", (n, D)), attn_qkv_b=opt("attn_qkv.bias", n))
        if qkv["attn_qkv_b"] is None and all(t.has(f"attn_{x}.bias") for x in "qkv"):
            # build_qkv: fused weights with separate q/k/v biases, concatenated
            qkv["attn_qkv_b"] = torch.cat([opt("attn_q.bias", D), opt("attn_k.bias", kv_out),
                                           opt("attn_v.bias", kv_out)])
    else:
        qkv.update(attn_q=w("attn_q", (D, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                   attn_q_b=opt("attn_q.bias", D), attn_k_b=opt("attn_k.bias", kv_out),
                   attn_v_b=opt("attn_v.bias", kv_out))
    return qkv


class NomicBertModel(BertModel):
    arch = "nomic-bert"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_NOMIC_BERT -> NEOX (applied: bert.cpp's rope branch)

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, type_row: torch.Tensor | None, embd_norm: torch.Tensor,
                 embd_norm_b: torch.Tensor, blocks: list[NomicBertBlock], act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.act_dtype = act_dtype
        self.token_embd = token_embd          # (V, D)
        self.position_embd = None             # rotary positions: no table
        self.type_row = type_row
        self.embd_norm, self.embd_norm_b = embd_norm, embd_norm_b
        self.blocks = blocks
        self.rank_head = None                 # no reranker head (bert's RankHead) for this architecture

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NomicBertModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D = cfg.vocab, cfg.d_model
        if cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: {cls.arch} needs head_count * head size == embedding_length (q and the "
                              f"output projection are (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {D}")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {cls.arch}.feed_forward_length is {cfg.ffn}: expected > 0")
        type_row = token_type_row(gf, D, device, cls.arch)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        embd_norm = load_vector(gf, "token_embd_norm.weight", device, D)
        embd_norm_b = load_vector(gf, "token_embd_norm.bias", device, D)
        blocks = [cls.load_block(gf, cfg, i, device, dtype) for i in range(cfg.n_layers)]
        return cls(cfg, token_embd, type_row, embd_norm, embd_norm_b, blocks, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> NomicBertBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw = t.w, t.v, t.opt, t.D, t.F
        for name in ("ffn_up.bias", "ffn_down.bias", "ffn_gate.bias"):
            if t.has(name):
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': llama.cpp's {cls.arch} graph never adds an "
                                  "MLP bias (bert.cpp's SwiGLU build_ffn passes none) while HF's would; the converter "
                                  "writes none, so such a file is refused rather than run one way or the other")
        return NomicBertBlock(
            **qkv_tensors(t),
            attn_output=w("attn_output", (D, D)), attn_output_b=opt("attn_output.bias", D),
            attn_output_norm=v("attn_output_norm.weight", D), attn_output_norm_b=v("attn_output_norm.bias", D),
            ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=None, ffn_gate=w("ffn_gate", (Fw, D)),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=None,
            layer_output_norm=v("layer_output_norm.weight", D), layer_output_norm_b=v("layer_output_norm.bias", D))

    # ---- declarations (minfer.models.base.Model) ----

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd]
        for b in self.blocks:
            ws += b.matrices()
        return ws

    def linear_groups(self) -> list[tuple]:
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.blocks if b.attn_qkv is None]

    def head_weights(self) -> list:
        return [self.token_embd]

    # ---- the forward ----

    def check_step(self, step: Step, cache) -> None:
        if step.start != 0:
            raise MinferError(f"{self.arch} is an encoder: its attention sees the whole input, which must go through "
                              f"one forward from position 0 (this step starts at {step.start})")

    def input_rows(self, tokens: torch.Tensor, step: Step) -> torch.Tensor:
        """token + token type 0, (T, D) float32 (no position rows: rope)."""
        x = ops.embedding(tokens, self.token_embd).float()
        return x if self.type_row is None else x + self.type_row

    def qkv(self, h: torch.Tensor, blk: NomicBertBlock, ctx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T, D) -> q (T, D), k, v (T, Hkv * Dh): the fused matrix's rows split q, k, v (build_qkv), or three."""
        if blk.attn_qkv is None:
            return ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (blk.attn_q_b, blk.attn_k_b, blk.attn_v_b),
                                   ctx)
        c = self.cfg
        qkv = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx)
        q, k, v = qkv.split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], dim=-1)
        return q.contiguous(), k.contiguous(), v.contiguous()     # column slices: the CUDA kernels take dense rows

    def attention(self, h: torch.Tensor, blk: NomicBertBlock, ctx, positions: torch.Tensor | None = None,
                  rope=None, window: int = 0) -> torch.Tensor:
        """h (T, D) -> W_o attn(rope(q), rope(k), v) + b_o (T, D), attention over every row of h (window > 0: only
        keys within window // 2 positions either side, llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = self.qkv(h, blk, ctx)
        if positions is None:
            positions = torch.arange(T, device=h.device)
        rope = rope or c.rope
        q = ops.rope(q.reshape(T, H, Dh), positions, rope)
        k = ops.rope(k.reshape(T, Hkv, Dh), positions, rope)
        v = v.reshape(T, Hkv, Dh)
        if window > 0:
            o = windowed_attention(q, k, v, Dh ** -0.5, positions, window)
        else:
            o = bidirectional_attention(q, k, v, Dh ** -0.5)
        return ops.linear(o, blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: NomicBertBlock, ctx) -> torch.Tensor:
        """W_down (silu(W_gate h) * W_up h), (T, D) -> (T, D) (LLM_FFN_SILU, LLM_FFN_PAR; no biases)."""
        g = ops.linear(h, blk.ffn_gate, None, ctx).float()
        u = ops.linear(h, blk.ffn_up, None, ctx).float()
        return ops.linear((F.silu(g) * u).to(h.dtype), blk.ffn_down, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) at positions 0..T-1 -> the hidden rows step.logits names, handed to an embeddings run."""
        self.check_step(step, cache)
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = layer_norm_b(self.input_rows(tokens, step), self.embd_norm, self.embd_norm_b, eps)
        for i, blk in enumerate(self.blocks):
            a = self.attention(x.to(act), blk, ctx, step.positions).float()
            if i == last:     # bert.cpp: the last layer's adds, norms and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = layer_norm_b(x + a, blk.attn_output_norm, blk.attn_output_norm_b, eps)
            f = self.mlp(x.to(act), blk, ctx).float()
            x = layer_norm_b(x + f, blk.layer_output_norm, blk.layer_output_norm_b, eps)
        return self.head(x, ctx)


def layer_norm_b(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm (ggml_norm) * w (+ b): (N, D) float32 -> float32."""
    y = ops.layer_norm(x, w, eps, torch.float32)
    return y if b is None else y + b


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, positions: torch.Tensor,
                       window: int) -> torch.Tensor:
    """bidirectional_attention with each query seeing only keys with |p_q - p_k| <= window // 2 (llama.cpp
    llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_SYMMETRIC): q (T, H, Dh), k / v (T, Hkv, Dh) -> (T, H * Dh)."""
    ops.paths.count("attention.bidirectional.torch")
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    d = positions[None, :] - positions[:, None]
    allowed = d.abs() <= window // 2
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=allowed, scale=scale)                # (H, T, Dh)
    return o.transpose(0, 1).reshape(T, H * Dh)
