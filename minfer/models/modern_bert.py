"""ModernBERT encoders (HF ModernBertModel: answerdotai/ModernBERT-base/large, gte-modernbert, granite-embedding R2):
the GGUF arch `modern-bert`. An encoder for embeddings only: pre-norm layers, rotary positions with two bases,
a symmetric sliding window on most layers, a GeGLU MLP, no biases:

    x_0 = LN(E[tokens]; token_embd_norm)                         no position table, no token types
    for each layer l:
        h = LN(x; attn_norm) (layer 0 without attn_norm: h = x)
        q, k, v = split(W_qkv h)                                   rope (NEOX) on q, k: base freq_base on the global
        x = x + W_o attn(q, k, v)                                  layers, freq_base_swa on the windowed ones
        x = x + W_down act(first half of W_up LN(x; ffn_norm)) * (second half)
    hidden = LN(x; output_norm)

Each rule and its source (llama.cpp src/models/modern-bert.cpp load_arch_hparams / load_arch_tensors / graph;
src/llama-model.cpp llama_model_rope_type, create_memory, get_rope_freq_base / get_rope_freq_scale,
load_swa_pattern, LLM_FFN_OP_TYPES_FROM_STRING; src/llama-hparams.cpp set_swa_pattern; src/llama-hparams.h
is_masked_swa; src/llama-graph.cpp build_ffn; ggml ggml_geglu; conversion/bert.py ModernBertModel; HF
modeling_modernbert):
- The input: the token's row, then LayerNorm with a weight and no bias (build_norm(inpL, tok_norm, nullptr,
  LLM_NORM)). Every norm here is a LayerNorm (mean subtracted) without bias, eps
  `modern-bert.attention.layer_norm_epsilon` (load_arch_hparams: get_key(LLM_KV_ATTENTION_LAYERNORM_EPS), required;
  this converter writes ModernBERT's norm_eps as layer_norm_rms_epsilon only, a file llama.cpp cannot load either:
  tools/gen_bert2_fixture.py adds the key).
- Tensors (load_arch_tensors): token_embd, token_embd_norm.weight, output_norm.weight; per layer attn_norm.weight
  (optional on layer 0 only: "layer 0 uses identity"; HF layer 0's attn_norm is nn.Identity), attn_qkv (3D, D),
  attn_output (D, D), ffn_up (2F, D), ffn_down (D, F), ffn_norm.weight. Nothing else: llama.cpp's loader fails a
  file with a tensor it did not create ("wrong number of tensors"), and a bias (HF norm_bias / attention_bias /
  mlp_bias true) would be one; here any tensor outside that list (but the classifier's cls.* / cls.output.*, which
  an embeddings run does not read) is refused by name.
- Pre-norm residuals: x + W_o attn(LN(x; attn_norm)), then (that) + MLP(LN(that; ffn_norm)); the last layer's
  adds and MLP on the output rows only (inp_out_ids); output_norm at the end gives the embeddings (res->t_embd).
- q/k/v: the fused matrix's rows q, k, v (build_qkv); rope NEOX (llama_model_rope_type: LLM_ARCH_MODERN_BERT ->
  NEOX; HF rotate_half) on q and k. A layer's base: `rope.freq_base_swa` on a sliding-window layer (default 10000:
  llama-hparams.h rope_freq_base_train_swa; converter: local_rope_theta), `rope.freq_base` on the others
  (global_rope_theta), llama_model::get_rope_freq_base; scale 1 on sliding layers (rope_freq_scale_train_swa).
  Scale 1/sqrt(head_dim); no KV cache (create_memory: none for MODERN_BERT).
- The window: `attention.sliding_window` n_swa > 0 (converter: local_attention) makes LLAMA_SWA_TYPE_SYMMETRIC:
  on a windowed layer key j is seen from query i only when |i - j| <= n_swa / 2 (is_masked_swa, integer half;
  HF: sliding_window = local_attention // 2). Which layers: `attention.sliding_window_pattern` as an array of
  per-layer flags, else its integer n (default 3) with dense_first: layer il is windowed unless il % n == 0
  (set_swa_pattern; HF layer_types from global_attn_every_n_layers). n_swa 0 or absent: every layer global.
- The MLP (build_ffn(ffn_up, ..., ffn_down, hparams.llm_ffn_op, LLM_FFN_SEQ) with no gate tensor): ffn_up's 2F rows
  split in halves, act(first) * second (ggml_glu, not swapped; HF: input, gate = Wi(x).chunk(2); act(input) *
  gate), then ffn_down. act from `modern-bert.hidden_activation` (LLM_FFN_OP_TYPES_FROM_STRING): gelu / geglu ->
  GeGLU (absent or another string: GeGLU too, llama.cpp's fallback), silu / swish / swiglu -> SwiGLU, reglu ->
  ReGLU; 'relu' maps to a non-gated ReLU there, which on ffn_up's 2F rows cannot feed ffn_down (F): refused.
  GeGLU's GELU is the tanh form (ggml_geglu -> ggml_gelu's formula; on the CPU via a float16 table), where
  HF's "gelu" is the exact erf: the hidden states move by ~6e-4 (relative to the largest value) on the fixture
  (tests/models/test_modern_bert.py); minfer follows llama.cpp.
- No lm head (BertModel.head refuses generation); the classifier head of a ModernBERT reranker is not read.
  `modern-bert.classifier.pooling_type` is the rank head's pooling, not the embeddings' (llama.cpp
  pooling_type_cls); a file without `modern-bert.pooling_type` needs the caller's pooling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig, RopeConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertModel, layer_norm_b
from minfer.weights import QWeight, load_qweight, load_vector

# modern-bert.hidden_activation -> the gated MLP's activation (LLM_FFN_OP_TYPES_FROM_STRING)
ACTIVATIONS = {"gelu": "geglu", "geglu": "geglu", "silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu",
               "reglu": "reglu"}


@dataclass
class ModernBertBlock:
    attn_norm: torch.Tensor | None           # (D,); None on layer 0 without one (identity)
    attn_qkv: QWeight                        # (3D, D)
    attn_output: QWeight                     # (D, D)
    ffn_norm: torch.Tensor                   # (D,)
    ffn_up: QWeight                          # (2F, D)
    ffn_down: QWeight                        # (D, F)
    window: int                              # n_swa on a sliding-window layer, else 0
    rope: RopeConfig                         # the layer's rope (freq_base or freq_base_swa)
    attn_qkv_b: torch.Tensor | None = None   # never in a modern-bert file (NomicBertModel.qkv / attention read
    attn_output_b: torch.Tensor | None = None  # these two)

    def matrices(self) -> list[QWeight]:
        return [self.attn_qkv, self.attn_output, self.ffn_up, self.ffn_down]


def swa_layers(gf, cfg: ModelConfig, arch: str) -> list[bool]:
    """Which layers are windowed (module doc: load_arch_hparams, load_swa_pattern, set_swa_pattern)."""
    n = cfg.n_layers
    if cfg.sliding_window <= 0:
        return [False] * n
    pattern = cfg.swa_pattern
    if isinstance(pattern, tuple):
        if len(pattern) < n:
            raise MinferError(f"{gf.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries, "
                              f"expected one per layer ({n})")
        return [bool(p) for p in pattern[:n]]
    p = 3 if pattern is None else pattern
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise MinferError(f"{gf.path}: {arch}.attention.sliding_window_pattern is {p!r}: expected an integer >= 0 "
                          "or one flag per layer")
    return [p == 0 or il % p != 0 for il in range(n)]


class ModernBertModel(NomicBertModel):
    arch = "modern-bert"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_MODERN_BERT -> NEOX

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, embd_norm: torch.Tensor, output_norm: torch.Tensor,
                 blocks: list[ModernBertBlock], act: str, act_dtype: torch.dtype = torch.float32):
        super().__init__(cfg, token_embd, None, embd_norm, None, blocks, act_dtype=act_dtype)
        self.output_norm = output_norm
        self.act = act            # "geglu", "swiglu" or "reglu"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ModernBertModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, arch = cfg.vocab, cfg.d_model, cls.arch
        if cfg.n_heads != cfg.n_kv_heads or cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: {arch} needs head_count_kv == head_count and head_count * head size == "
                              f"embedding_length (attn_qkv is (3 x {D}, {D})); got {cfg.n_heads} heads, "
                              f"{cfg.n_kv_heads} kv heads of {cfg.head_dim}")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {arch}.feed_forward_length is {cfg.ffn}: expected > 0")
        name = gf.metadata.get(f"{arch}.hidden_activation", "gelu")
        if not isinstance(name, str):
            raise MinferError(f"{gf.path}: {arch}.hidden_activation is {name!r}: expected a string (gelu, silu, ...)")
        if name == "relu":
            raise MinferError(f"{gf.path}: {arch}.hidden_activation 'relu': llama.cpp maps it to a non-gated ReLU, "
                              f"which ffn_up's 2 x {cfg.ffn} rows cannot feed into ffn_down ({cfg.ffn} columns)")
        act = ACTIVATIONS.get(name, "geglu")      # llama.cpp's fallback for another name: GeGLU
        cls.check_tensor_names(gf, cfg)
        windowed = swa_layers(gf, cfg, arch)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        embd_norm = load_vector(gf, "token_embd_norm.weight", device, D)
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        blocks = []
        for i in range(cfg.n_layers):
            t = BlockTensors(gf, cfg, i, device, dtype)
            attn_norm = None if i == 0 and not t.has("attn_norm.weight") else t.v("attn_norm.weight", D)
            blocks.append(ModernBertBlock(
                attn_norm=attn_norm, attn_qkv=t.w("attn_qkv", (3 * D, D)), attn_output=t.w("attn_output", (D, D)),
                ffn_norm=t.v("ffn_norm.weight", D), ffn_up=t.w("ffn_up", (2 * cfg.ffn, D)),
                ffn_down=t.w("ffn_down", (D, cfg.ffn)), window=cfg.sliding_window if windowed[i] else 0,
                rope=cfg.rope_swa if windowed[i] else cfg.rope))
        return cls(cfg, token_embd, embd_norm, output_norm, blocks, act, act_dtype=act_dtype)

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor llama.cpp's loader would not create (module doc)."""
        known = {"token_embd.weight", "token_embd_norm.weight", "output_norm.weight"}
        for i in range(cfg.n_layers):
            known |= {f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_qkv", "attn_output", "ffn_up", "ffn_down",
                                                      "ffn_norm")}
        for name in gf.tensors:
            if name not in known and not name.startswith("cls."):
                raise MinferError(f"{gf.path}: tensor '{name}' is not part of a {cls.arch} model (llama.cpp's loader "
                                  "refuses the file too: it creates no such tensor; ModernBERT has no biases)")

    # ---- declarations (minfer.models.base.Model) ----

    def linear_groups(self) -> list[tuple]:
        return []

    # ---- the forward ----

    def mlp(self, h: torch.Tensor, blk: ModernBertBlock, ctx) -> torch.Tensor:
        """W_down act(a) * g with a, g the halves of W_up h (ggml_glu), (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, None, ctx).float()
        a, g = u.chunk(2, dim=-1)
        if self.act == "geglu":
            a = F.gelu(a, approximate="tanh")
        elif self.act == "swiglu":
            a = F.silu(a)
        else:
            a = F.relu(a)
        return ops.linear((a * g).to(h.dtype), blk.ffn_down, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) at positions 0..T-1 -> the hidden rows step.logits names, handed to an embeddings run."""
        self.check_step(step, cache)
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = layer_norm_b(ops.embedding(tokens, self.token_embd).float(), self.embd_norm, None, eps)
        for i, blk in enumerate(self.blocks):
            h = x if blk.attn_norm is None else layer_norm_b(x, blk.attn_norm, None, eps)
            a = self.attention(h.to(act), blk, ctx, step.positions, blk.rope, blk.window).float()
            if i == last:     # modern-bert.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + a
            f = self.mlp(layer_norm_b(x, blk.ffn_norm, None, eps).to(act), blk, ctx).float()
            x = x + f
        return self.head(layer_norm_b(x, self.output_norm, None, eps), ctx)
