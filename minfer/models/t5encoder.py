"""T5 encoders (the encoder half of T5 as an embedding model: HF T5EncoderModel, sentence-t5, the encoders of t5,
t5-v1.1 and flan-t5): the GGUF arch `t5encoder`. An encoder for embeddings only:

    x_0 = E[tokens]                                              token_embd (V, D); no position table, no types
    B[h, i, j] = rel_b[bucket(j - i), h]                         layer 0's table (n_buckets, H), for every layer
    for each layer l:
        h = RMSNorm(x; attn_norm)                                T5LayerNorm: no mean subtracted, no bias
        q, k, v = W_q h, W_k h, W_v h                            (H*Dh, D), no biases, no rope
        x = x + W_o softmax(q k^T + B) v                         NO 1/sqrt(Dh) scale; over ALL tokens
        h = RMSNorm(x; ffn_norm)
        x = x + W_down (gelu(W_gate h) * W_up h)                 with ffn_gate (t5-v1.1, flan-t5), else
        x = x + W_down relu(W_up h)                              (the original t5)
    hidden = RMSNorm(x; output_norm)                             the rows an embeddings run pools

Each rule and its source (llama.cpp src/models/t5encoder.cpp load_arch_hparams / load_arch_tensors, whose graph is
t5's encoder: src/models/models.h `llama_model_t5encoder::graph = llama_model_t5::graph<true>`, src/models/t5.cpp;
src/llama-graph.cpp llama_relative_position_bucket, llm_graph_input_pos_bucket::set_input, build_pos_bias,
build_ffn; src/llama-context.cpp encode; conversion/t5.py T5EncoderModel; gguf-py constants.py MODEL_TENSOR.ENC_*;
HF modeling_t5 T5LayerNorm / T5Attention / T5DenseActDense / T5DenseGatedActDense / T5Stack):
- Tensors (load_arch_tensors; gguf-py names): token_embd (V, D); enc.output_norm.weight (D,); per layer
  enc.blk.N.attn_norm.weight, attn_q / attn_k / attn_v (H*Dh, D), attn_o (D, H*Dh), attn_rel_b (n_buckets, H)
  (TENSOR_NOT_REQUIRED), ffn_norm.weight, ffn_gate (F, D) (TENSOR_NOT_REQUIRED), ffn_up (F, D), ffn_down (D, F).
  llama.cpp sizes attn_q by n_embd_k_gqa (head_count_kv heads) and the graph reshapes q to head_count heads, so
  only head_count_kv == head_count runs there (T5 files carry no head_count_kv): another count is refused by
  name. No biases anywhere. An `output.weight` (the loader's optional lm head, never used by the encoder graph) is
  accepted and not read; any other tensor is refused by name (llama.cpp's loader: "wrong number of tensors").
  The head size Dh is `attention.key_length` (the converter writes HF d_kv: n_head * d_kv need not be D),
  `attention.value_length` must equal it (t5.cpp GGML_ASSERT).
- The input: the token's row only (build_inp_embd(tok_embd)); T5 has no absolute positions.
- Every norm is an RMSNorm with a weight, no mean and no bias (build_norm(..., LLM_NORM_RMS); HF T5LayerNorm: x *
  rsqrt(mean(x^2) + eps) * w in float32), eps `t5encoder.attention.layer_norm_rms_epsilon` (load_arch_hparams,
  required; the converter writes HF layer_norm_epsilon there and under layer_norm_epsilon, which nothing reads).
- Pre-norm residuals: x + W_o attn(RMSNorm(x; attn_norm)), then + FFN(RMSNorm(.; ffn_norm)); the last layer's
  residual add and FFN on the output rows only (inp_out_ids); enc.output_norm gives the embeddings (res->t_embd;
  HF T5Stack's final_layer_norm: last_hidden_state is the same row).
- Attention: softmax(q k^T + B) v with kq_scale 1.0 (build_attn(..., kq_b, ..., 1.0f, il): T5 folds 1/sqrt(d_kv)
  into its q weights at training; HF T5Attention has no scale either), over every key (llama_context::encode sets
  causal_attn false for an encoder graph; the converter writes no attention.causal key and the arch has no
  decoder: causal_key_default False here). No KV cache, so the whole input is ONE forward from position 0
  (runtime/embed.py runs a non-causal model's input as one chunk). llama.cpp's llama_decode path
  (llama-embedding, llama-cpp-python's Llama.embed) on a DEFAULT context differs: create_memory makes a KV cache
  for T5ENCODER and causal_attn stays true without the key, so it masks the encoder causally (rows ~1 apart on
  the fixture); with `--attention non-causal` (attention_type NON_CAUSAL), or through llama_encode, it computes
  what transformers and minfer do
  (tests/models/test_t5encoder.py test_llamacpp_encode_and_its_default_decode).
- The relative position bias B (build_pos_bias; HF T5Attention.compute_bias): B[h, query i, key j] =
  rel_b[bucket(pos_j - pos_i), h]: llm_graph_input_pos_bucket::set_input stores
  llama_relative_position_bucket(pos[key], pos[query], n_rel_attn_bkts, bidirectional=true), x - y = key - query
  (HF: memory_position - context_position). The bucket (llama_relative_position_bucket, which agrees with HF
  _relative_position_bucket: tests/models/test_t5encoder.py over -300..300): n = n_buckets / 2 (bidirectional),
  n for a key after the query (rel > 0) plus, of |rel|: |rel| itself below max_exact = n / 2, else
  min(n - 1, floor(max_exact + logf(|rel| / max_exact) * (n - max_exact) / log(max_distance / max_exact))), with
  max_distance fixed at 128 (llama.cpp's "TODO move to hparams": HF relative_attention_max_distance, 128 in every
  released T5, is not written by the converter). Bucket count `t5encoder.attention.relative_buckets_count`
  (required by load_arch_hparams). The table: each layer's own `attn_rel_b` where it has one, else layer 0's
  (t5.cpp: `layers[il].attn_rel_b_enc ? ... : layers[0].attn_rel_b_enc`); HF T5Stack gives only block 0 a
  relative_attention_bias and passes its position_bias on to the others, which is what the converter writes.
  Layer 0's table is then needed (llama.cpp would read a null tensor without it): its absence is refused by name.
  Scores and bias in float32, query rows in chunks (SCORE_BYTES), on both backends: the counted path
  attention.relbias.torch.
- The FFN (build_ffn; "T5 uses relu, flan-T5 uses gelu-gated"), chosen per layer by ffn_gate's presence:
  ffn_gate present: LLM_FFN_GELU + LLM_FFN_PAR = W_down (gelu(W_gate h) * W_up h), GELU's tanh form (ggml_gelu; HF
  "gated-gelu" is gelu_new, the same tanh form; the converter writes DenseReluDense.wi_0 as ffn_gate and wi_1 as
  ffn_up). Absent: LLM_FFN_RELU + LLM_FFN_SEQ = W_down relu(W_up h) (HF "relu": DenseReluDense.wi -> ffn_up).
  Other HF activations (feed_forward_proj "gated-silu", "gelu", ...) are not what llama.cpp computes; the file does
  not say which HF used, so minfer follows llama.cpp's graph.
- Pooling: build_pooling on those rows by `t5encoder.pooling_type` or the caller's; the converter writes no
  pooling_type for T5 (llama.cpp then pools NONE), so minfer asks the caller for one (runtime/embed.py
  pooling_of: `minfer embed --pooling mean`, sentence-t5's pooling). CLS is the first row, LAST the last.
- The tokenizer the converter writes is SentencePiece Unigram `t5` (minfer/tokenizer/ugm.py), </s> appended
  (add_eos_token), no BOS.
- No lm head and no decoder: BertModel.head refuses generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.eurobert import EuroBertModel
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertModel
from minfer.weights import QWeight, load_dense, load_qweight, load_vector

SCORE_BYTES = 128 << 20     # the float32 scores (H, rows, T) one chunk of query rows writes out
MAX_DISTANCE = 128          # llama_relative_position_bucket's max_distance (fixed in llama.cpp)


@dataclass
class T5EncoderBlock:
    attn_norm: torch.Tensor                  # (D,)
    attn_q: QWeight                          # (H*Dh, D)
    attn_k: QWeight                          # (Hkv*Dh, D)
    attn_v: QWeight                          # (Hkv*Dh, D)
    attn_output: QWeight                     # (D, Hkv*Dh): the file's attn_o
    attn_rel_b: torch.Tensor | None          # (n_buckets, H) float32, or None: layer 0's
    ffn_norm: torch.Tensor                   # (D,)
    ffn_gate: QWeight | None                 # (F, D): the gated GELU FFN; None: ReLU
    ffn_up: QWeight                          # (F, D)
    ffn_down: QWeight                        # (D, F)
    attn_qkv: QWeight | None = None          # never (NomicBertModel.linear_groups reads it)

    def matrices(self) -> list[QWeight]:
        return [w for w in (self.attn_q, self.attn_k, self.attn_v, self.attn_output, self.ffn_gate, self.ffn_up,
                            self.ffn_down) if w is not None]


def relative_position_bucket(rel: torch.Tensor, n_buckets: int, max_distance: int = MAX_DISTANCE) -> torch.Tensor:
    """llama.cpp's llama_relative_position_bucket(x, y, n_buckets, bidirectional=true) of rel = x - y (key position
    minus query position), any int tensor -> int64 buckets in [0, n_buckets), with its float steps: logf of the
    ratio in float32, times (n - max_exact) in float32, divided by the double log, max_exact added in double, the
    sum rounded to float32 by floorf's argument."""
    n = n_buckets >> 1
    max_exact = n >> 1
    a = rel.abs().to(torch.int64)
    ratio = (a.clamp(min=1).double() / max_exact).float()
    big = (torch.log(ratio) * float(n - max_exact)).double() / math.log(max_distance / max_exact)
    big = torch.floor((max_exact + big).float()).to(torch.int64).clamp(max=n - 1)
    return (rel > 0).to(torch.int64) * n + torch.where(a < max_exact, a, big)


def relbias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                      rel_b: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """softmax(q k^T + rel_b[bucket(p_j - p_i)]) v over every key of the input, no scale, in float32: q (T, H, Dh),
    k / v (T, Hkv, Dh) (query head h reads kv head h // (H / Hkv)), positions (T,), rel_b (n_buckets, H) ->
    (T, H * Dh) in q's dtype. The query rows go in chunks so the written-out scores stay under SCORE_BYTES."""
    ops.paths.count("attention.relbias.torch")
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    qh, kh, vh = (x.transpose(0, 1).float() for x in (q, k, v))        # (H, T, Dh)
    pos = positions.to(q.device)
    table = rel_b.to(device=q.device, dtype=torch.float32).t()          # (H, n_buckets)
    rows = max(1, SCORE_BYTES // (4 * H * T))
    out = torch.empty((H, T, Dh), dtype=torch.float32, device=q.device)
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        bucket = relative_position_bucket(pos[None, :] - pos[r0:r1, None], n_buckets)     # (rows, T): key - query
        bias = table[:, bucket]                                                            # (H, rows, T)
        out[:, r0:r1] = F.scaled_dot_product_attention(qh[:, r0:r1], kh, vh, attn_mask=bias, scale=1.0)
    return out.transpose(0, 1).reshape(T, H * Dh).to(q.dtype)


class T5EncoderModel(NomicBertModel):
    """The encoder pieces NomicBertModel provides (the step check, the weights' declarations, BertModel.head's refusal
    of generation) in T5's pre-norm RMSNorm layout with the relative position bias (module doc)."""

    arch = "t5encoder"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_T5ENCODER -> NONE (no rope; declared for the registry)
    causal_key_default = False    # the converter writes no attention.causal; llama_context::encode: never causal
    norm_eps_key = "attention.layer_norm_rms_epsilon"    # t5encoder.cpp load_arch_hparams

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, output_norm: torch.Tensor,
                 blocks: list[T5EncoderBlock], n_buckets: int, act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.act_dtype = act_dtype
        self.token_embd = token_embd          # (V, D)
        self.position_embd = None             # relative positions only: no table
        self.type_row = None
        self.embd_norm = self.embd_norm_b = None
        self.output_norm = output_norm        # (D,)
        self.blocks = blocks
        self.n_buckets = n_buckets
        self.rank_head = None                 # t5encoder.cpp creates no classifier head

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "T5EncoderModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, arch = cfg.vocab, cfg.d_model, cls.arch
        key = f"{arch}.attention.relative_buckets_count"
        nb = gf.metadata.get(key)
        if nb is None:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model: "
                              "t5encoder.cpp load_arch_hparams reads it)")
        if not isinstance(nb, int) or isinstance(nb, bool) or nb < 4:
            raise MinferError(f"{gf.path}: {key} is {nb!r}: expected an integer >= 4 (half a direction's buckets "
                              "exact, half log-spaced)")
        dv = gf.metadata.get(f"{arch}.attention.value_length", cfg.head_dim)
        if dv != cfg.head_dim:
            raise MinferError(f"{gf.path}: {arch}.attention.value_length {dv} != key_length {cfg.head_dim} "
                              "(t5.cpp: GGML_ASSERT(n_embd_head == n_embd_head_k))")
        if cfg.n_kv_heads != cfg.n_heads:
            raise MinferError(f"{gf.path}: {arch}.attention.head_count_kv {cfg.n_kv_heads} != head_count "
                              f"{cfg.n_heads}: t5encoder.cpp creates attn_q with head_count_kv heads' rows and the "
                              "graph reshapes it to head_count heads, so llama.cpp runs no grouped kv heads here")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {arch}.feed_forward_length is {cfg.ffn}: expected > 0")
        cls.check_tensor_names(gf, cfg)
        if "enc.blk.0.attn_rel_b.weight" not in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'enc.blk.0.attn_rel_b.weight' is missing: layer 0's relative "
                              "position bias, which every layer without its own uses (llama.cpp's graph would read "
                              "a null tensor)")
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        output_norm = load_vector(gf, "enc.output_norm.weight", device, D)
        q_out, kv_out, H = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_heads
        blocks = []
        for i in range(cfg.n_layers):
            t = BlockTensors(gf, cfg, i, device, dtype)
            t.p = f"enc.blk.{i}."
            rel_b = None
            name = f"enc.blk.{i}.attn_rel_b.weight"
            if name in gf.tensors:
                shape = tuple(int(d) for d in gf.tensor(name).shape)
                if shape != (nb, H):
                    raise MinferError(f"{gf.path}: tensor '{name}' has shape {shape}, expected ({nb}, {H}) "
                                      f"({key}, head_count)")
                rel_b = load_dense(gf, name).reshape(nb, H).float().to(device)
            blocks.append(T5EncoderBlock(
                attn_norm=t.v("attn_norm.weight", D), attn_q=t.w("attn_q", (q_out, D)),
                attn_k=t.w("attn_k", (kv_out, D)), attn_v=t.w("attn_v", (kv_out, D)),
                attn_output=t.w("attn_o", (D, kv_out)), attn_rel_b=rel_b, ffn_norm=t.v("ffn_norm.weight", D),
                ffn_gate=t.w("ffn_gate", (t.F, D)) if t.has("ffn_gate.weight") else None,
                ffn_up=t.w("ffn_up", (t.F, D)), ffn_down=t.w("ffn_down", (D, t.F))))
        return cls(cfg, token_embd, output_norm, blocks, nb, act_dtype=act_dtype)

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor llama.cpp's t5encoder loader would not create (module doc)."""
        known = {"token_embd.weight", "enc.output_norm.weight", "output.weight"}
        for i in range(cfg.n_layers):
            known |= {f"enc.blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_o",
                                                          "attn_rel_b", "ffn_norm", "ffn_gate", "ffn_up",
                                                          "ffn_down")}
        for name in gf.tensors:
            if name not in known:
                raise MinferError(f"{gf.path}: tensor '{name}' is not part of a {cls.arch} model (llama.cpp's loader "
                                  "refuses the file too: src/models/t5encoder.cpp creates no such tensor)")

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: T5EncoderBlock, ctx, positions: torch.Tensor | None = None,
                  rope=None, window: int = 0) -> torch.Tensor:
        """h (T, D) -> W_o softmax(q k^T + B) v (T, D) over every row of h, B from the layer's own table or
        layer 0's."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        if positions is None:
            positions = torch.arange(T, device=h.device)
        table = blk.attn_rel_b if blk.attn_rel_b is not None else self.blocks[0].attn_rel_b
        o = relbias_attention(q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), positions, table,
                              self.n_buckets)
        return ops.linear(o, blk.attn_output, None, ctx)

    def mlp(self, h: torch.Tensor, blk: T5EncoderBlock, ctx) -> torch.Tensor:
        """W_down (gelu_tanh(W_gate h) * W_up h) with a gate, else W_down relu(W_up h); (T, D) -> (T, D)."""
        if blk.ffn_gate is not None:
            gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
            return ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx)
        return ops.linear(F.relu(ops.linear(h, blk.ffn_up, None, ctx)), blk.ffn_down, None, ctx)

    # the pre-norm encoder loop is EuroBERT's (t5.cpp's encoder runs the same adds and norms, the last layer's add
    # and FFN on the output rows only); attention (the relative bias) and mlp are this class's
    forward = EuroBertModel.forward
