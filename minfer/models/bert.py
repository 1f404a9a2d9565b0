"""BERT encoders (HF BertModel / BertForMaskedLM, sentence-transformers BERT models such as all-MiniLM-L6-v2
and bge-small): the GGUF arch `bert`. An encoder for embeddings only: no lm head, no generation.

    x_0 = LN(E[tokens] + T[0] + P[positions]; token_embd_norm)    token_embd (V, D), token_types (n_types, D),
                                                                   position_embd (n_ctx_train, D)
    for each layer l:
        q, k, v = W_q x + b_q, W_k x + b_k, W_v x + b_v           separate matrices, no rope
        x = LN(x + W_o attn(q, k, v) + b_o; attn_output_norm)      attention over ALL tokens (bidirectional)
        x = LN(x + W_down gelu(W_up x + b_up) + b_down; layer_output_norm)
    hidden = x                                                     (Model.head: taken by an embeddings run)

Each rule and its source (llama.cpp src/models/bert.cpp, src/llama-model.cpp, src/llama-vocab.cpp, src/llama-graph.cpp
build_attn_inp_no_cache; conversion/bert.py BertModel; HF modeling_bert BertEmbeddings / BertSelfAttention /
BertSelfOutput / BertIntermediate / BertOutput):
- The input: the token's row, plus row 0 of `token_types.weight` (bert.cpp: "token types are hardcoded to zero
  (Sentence A)"; HF token_type_ids default zeros), plus the learned absolute position's row (bert.cpp ggml_get_rows
  (pos_embd, inp_pos); HF position_ids from 0), then a LayerNorm with weight and bias (build_norm(inpL, tok_norm,
  tok_norm_b, LLM_NORM); HF embeddings.LayerNorm). `token_types.weight` is optional (TENSOR_NOT_REQUIRED: no row
  added without it) but `tokenizer.ggml.token_type_count` must be > 0 (load_arch_tensors: "model needs to define
  token type count"). `position_embd.weight` (context_length, D) and the norm's weight and bias are required.
  No rope (llama_model_rope_type lists LLM_ARCH_BERT under NEOX, but its graph rotates only nomic / jina-v3):
  rope_style "neox" is declared for the registry only.
- Post-norm residuals: LN(x + attention) (attn_output_norm), then LN(that + MLP) (layer_output_norm), both
  LayerNorms with weight and bias, eps `bert.attention.layer_norm_epsilon` (load_arch_hparams
  LLM_KV_ATTENTION_LAYERNORM_EPS; HF layer_norm_eps).
- q/k/v from separate matrices with optional biases (create_tensor_qkv: attn_q/attn_k/attn_v weight flag 0,
  biases TENSOR_NOT_REQUIRED; HF query/key/value nn.Linear with bias, which conversion/bert.py writes as
  attn_q/attn_k/attn_v). The fused `attn_qkv` that llama.cpp's loader also takes is not what the converter writes
  for BERT: refused by name. attn_output (D, D) with an optional bias.
- Attention sees every token of the input, before and after it (build_attn_inp_no_cache with
  hparams.causal_attn false: the converter writes `bert.attention.causal` false, BertModel.set_gguf_parameters;
  HF's encoder mask is all ones), scale 1/sqrt(head_dim), softmax, no KV cache (llama.cpp creates no memory for
  BERT: llama_model::create_memory). So the whole input goes through ONE forward from position 0
  (runtime/embed.py runs a non-causal model's input as one chunk); the KV cache is never written. The attention
  is torch's scaled_dot_product_attention on both backends, counted as the path attention.bidirectional.torch.
- The MLP is not gated: W_down gelu(W_up x + b_up) + b_down (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ)), with
  GELU's tanh approximation as llama.cpp computes it (ggml_gelu; on its CPU a float16 table, GGML_GELU_FP16).
  HF BERT's hidden_act "gelu" is the exact erf GELU: on the tiny fixture the two give hidden states ~3e-4 apart
  (relative to the largest value; tests/models/test_bert.py measures it); minfer follows llama.cpp. Applied
  with torch's gelu on both backends. ffn_up / ffn_down biases optional (TENSOR_NOT_REQUIRED).
- The last layer's adds, norms and MLP run on the rows the step wants only (bert.cpp inp_out_ids, after the
  last attention), and the hidden rows after the last layer_output_norm are the embeddings (res->t_embd;
  build_pooling pools them). There is no lm head: `head` hands the rows to an embeddings run and otherwise
  refuses with a MinferError (generation, Engine.logits).
- A reranker (cross-encoder: HF BertForSequenceClassification, e.g. cross-encoder/ms-marco-MiniLM-L-6-v2)
  carries a classifier head, read into `rank_head` (RankHead; None without one) and run by pooling 'rank'
  (runtime/embed.py, Engine.rerank):
  * tensors (src/models/bert.cpp llama_model_bert::load_arch_tensors, all TENSOR_NOT_REQUIRED): `cls.weight`
    (D, D) + `cls.bias` (D,), and `cls.output.weight` (n_cls_out, D) + `cls.output.bias` (n_cls_out,), where
    n_cls_out is the length of `bert.classifier.output_labels`, else 1 (llama-model.cpp load_hparams
    LLM_KV_CLASSIFIER_OUTPUT_LABELS; llama-hparams.h n_cls_out = 1).
  * what the converter writes (conversion/bert.py BertModel): for BertForSequenceClassification with labels
    other than AutoConfig's two dummies, `classifier` is renamed classifier.out_proj, which gguf-py's
    tensor_mapping names `cls.output` (CLS_OUT); the HF pooler (`bert.pooler.dense` + tanh) is dropped by
    filter_tensors ("we are only using BERT for embeddings"), so such a file has `cls.output` only and
    llama.cpp's score is classifier(h[CLS]), not transformers' classifier(tanh(pooler(h[CLS]))): a different
    scale, same input. Token types are all 0 here too (bert.cpp), where HF gives the document type 1.
  * the row (llama-graph.cpp build_pooling LLM_POOLING_TYPE_RANK, llm_graph_input_cls::set_input): the row at
    the smallest position (the first token, [CLS]) for a non-causal model, or the rows' mean when
    `bert.classifier.pooling_type` is 1 (MEAN: hparams.pooling_type_cls).
  * the head (build_pooling RANK): with `cls`: tanh(cls x + cls_b) (gelu only for modern-bert); then with
    `cls_out`: cls_out x + cls_out_b. No softmax (that is qwen3's reranker only). The result: n_cls_out raw
    logits; llama-server's send_rerank reports element 0 as the relevance score. The head's matrices are
    tiny: kept float32 on the CPU and applied to the pooled row there.
  * the decoders' rerankers (Qwen3-Reranker; models/qwen3.py) read theirs with load_rank_head too, by their arch:
    `cls.output` only (src/models/qwen3.cpp / qwen3vl.cpp load_arch_tensors create no `cls`, so one is refused by
    name), pooled at the LAST token (llm_graph_input_cls::set_input: RANK with causal attention), and a softmax
    over the outputs (build_pooling RANK: "softmax for qwen3 reranker", arch QWEN3 / QWEN3VL): element 0 is then
    the probability of the first label ("yes").
- The batch engine's paged cache is not used: paged_kv False (`minfer serve` serves one request at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Model, Step
from minfer.models.layers import BlockTensors
from minfer.models.starcoder import StarcoderModel
from minfer.models.starcoder2 import layer_norm
from minfer.weights import QWeight, load_dense, load_qweight, load_vector


@dataclass
class BertBlock:
    attn_q: QWeight                          # (D, D)
    attn_k: QWeight                          # (Hkv*Dh, D)
    attn_v: QWeight                          # (Hkv*Dh, D)
    attn_q_b: torch.Tensor | None
    attn_k_b: torch.Tensor | None
    attn_v_b: torch.Tensor | None
    attn_output: QWeight                     # (D, D)
    attn_output_b: torch.Tensor | None
    attn_output_norm: torch.Tensor           # (D,)
    attn_output_norm_b: torch.Tensor         # (D,)
    ffn_up: QWeight                          # (F, D)
    ffn_up_b: torch.Tensor | None
    ffn_down: QWeight                        # (D, F)
    ffn_down_b: torch.Tensor | None
    layer_output_norm: torch.Tensor          # (D,)
    layer_output_norm_b: torch.Tensor        # (D,)

    def matrices(self) -> list[QWeight]:
        return [self.attn_q, self.attn_k, self.attn_v, self.attn_output, self.ffn_up, self.ffn_down]


@dataclass
class RankHead:
    """A reranker's classifier head (module doc): pooled row (D,) -> n_cls_out raw logits, or their softmax for
    the archs whose graph adds one (qwen3 / qwen3vl: SOFTMAX_ARCHS) (llama-graph.cpp build_pooling,
    LLM_POOLING_TYPE_RANK). Float32 tensors on the CPU."""
    cls: torch.Tensor | None                 # (D, D): HF pooler-like dense, tanh after
    cls_b: torch.Tensor | None
    cls_out: torch.Tensor | None             # (n_cls_out, D)
    cls_out_b: torch.Tensor | None
    labels: list[str]                        # bert.classifier.output_labels ([] when absent)
    mean: bool = False                       # bert.classifier.pooling_type MEAN: pool the mean, not the first row
    pair_meta: dict | None = None            # tokenizer metadata the pair layout reads (runtime/embed.py pair_ids)
    softmax: bool = False                    # softmax over the n_cls_out outputs (SOFTMAX_ARCHS)

    @property
    def n_out(self) -> int:
        return self.cls_out.shape[0] if self.cls_out is not None else self.cls.shape[0]

    def __call__(self, row: torch.Tensor) -> torch.Tensor:
        x = row.float().cpu()
        if self.cls is not None:       # build_pooling: ggml_mul_mat(cls) + cls_b, then ggml_tanh (arch != modern-bert)
            x = x @ self.cls.T
            if self.cls_b is not None:
                x = x + self.cls_b
            x = torch.tanh(x)
        if self.cls_out is not None:   # build_pooling: ggml_mul_mat(cls_out) + cls_out_b
            x = x @ self.cls_out.T
            if self.cls_out_b is not None:
                x = x + self.cls_out_b
        if self.softmax:               # build_pooling: ggml_soft_max for LLM_ARCH_QWEN3 / LLM_ARCH_QWEN3VL
            x = torch.softmax(x, dim=-1)
        return x


# llama-graph.cpp build_pooling RANK: the archs whose head ends in a softmax over its outputs
SOFTMAX_ARCHS = ("qwen3", "qwen3vl")
# the archs whose loader creates the classifier's output layer only (src/models/qwen3.cpp, qwen3vl.cpp
# load_arch_tensors: cls_out, no cls / cls_b): a dense `cls` layer in such a file is refused by name
OUT_ONLY_ARCHS = ("qwen3", "qwen3vl")


def load_rank_head(gf, D: int, arch: str = "bert") -> RankHead | None:
    """The classifier tensors (module doc), None when the file has neither `cls.weight` nor `cls.output.weight`.
    Shapes as llama_model_bert::load_arch_tensors creates them; a bias without its matrix is refused, and so is a
    `cls` layer for an arch of OUT_ONLY_ARCHS. `arch`: the file's, which names the keys and the softmax rule."""
    labels = gf.metadata.get(f"{arch}.classifier.output_labels")
    labels = [str(x) for x in labels] if isinstance(labels, list) else []
    n_out = len(labels) or 1

    def opt(name: str, shape: tuple) -> torch.Tensor | None:
        if name not in gf.tensors:
            return None
        info = gf.tensor(name)
        got = tuple(int(d) for d in info.shape)
        if got != shape and not (len(shape) == 2 and shape[0] == 1 and got == shape[1:]):   # (1, D) may be 1-D
            raise MinferError(f"{gf.path}: tensor '{name}' has shape {got}, expected {shape}"
                              + (f" ({arch}.classifier.output_labels has {len(labels)})" if "output" in name else ""))
        return load_dense(gf, name).reshape(shape).float()

    # a `cls.output.bias` is still read and added (build_pooling adds cls_out_b when a model has one), although
    # llama.cpp's qwen3 / qwen3vl loaders create none (their converter writes none; llama.cpp refuses such a file)
    if arch in OUT_ONLY_ARCHS:
        for name in ("cls.weight", "cls.bias"):
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}': {arch}'s reranker head is the output layer "
                                  f"'cls.output.weight' only (llama.cpp src/models/{arch}.cpp load_arch_tensors "
                                  "creates no `cls` layer, and refuses a file that has one)")
    cls_w, cls_b = opt("cls.weight", (D, D)), opt("cls.bias", (D,))
    out_w, out_b = opt("cls.output.weight", (n_out, D)), opt("cls.output.bias", (n_out,))
    for b, w, name in ((cls_b, cls_w, "cls"), (out_b, out_w, "cls.output")):
        if b is not None and w is None:
            raise MinferError(f"{gf.path}: tensor '{name}.bias' without '{name}.weight'")
    if cls_w is None and out_w is None:
        return None
    mean = gf.metadata.get(f"{arch}.classifier.pooling_type") == 1   # llama_pooling_type MEAN
    meta = {k: gf.metadata.get(k) for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                            "tokenizer.ggml.add_sep_token", "tokenizer.chat_template.rerank")}
    return RankHead(cls_w, cls_b, out_w, out_b, labels, mean, meta, softmax=arch in SOFTMAX_ARCHS)


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T) v over every key of the input (no mask): q (T, H, Dh), k / v (T, Hkv, Dh) ->
    (T, H * Dh) in q's dtype. Grouped kv heads are repeated (head h reads kv head h // (H / Hkv), ggml's
    broadcast in build_attn_mha)."""
    ops.paths.count("attention.bidirectional.torch")
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       is_causal=False, scale=scale)                  # (H, T, Dh)
    return o.transpose(0, 1).reshape(T, H * Dh)


class BertModel(Model):
    arch = "bert"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_BERT -> NEOX (never applied: no rope)
    norm_eps_key = "attention.layer_norm_epsilon"
    paged_kv = False          # no KV cache at all
    causal = False            # an encoder: bidirectional attention, embeddings only

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, position_embd: QWeight, type_row: torch.Tensor | None,
                 embd_norm: torch.Tensor, embd_norm_b: torch.Tensor, blocks: list[BertBlock],
                 act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.act_dtype = act_dtype
        self.token_embd = token_embd          # (V, D)
        self.position_embd = position_embd    # (n_pos, D)
        self.n_pos = position_embd.shape[0]
        self.type_row = type_row              # (D,) float32: token_types row 0, or None
        self.embd_norm, self.embd_norm_b = embd_norm, embd_norm_b
        self.blocks = blocks
        self.rank_head: RankHead | None = None   # a reranker's classifier head (from_gguf), run by pooling 'rank'

    @property
    def device(self) -> torch.device:
        return self.embd_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BertModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D = cfg.vocab, cfg.d_model
        if "blk.0.attn_qkv.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_qkv.weight': a fused q/k/v matrix, which llama.cpp's "
                              "converter does not write for BERT; minfer's bert takes attn_q / attn_k / attn_v only")
        if cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: bert needs head_count * head size == embedding_length (q and the output "
                              f"projection are (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {D}")
        n_types = gf.metadata.get("tokenizer.ggml.token_type_count")
        if not isinstance(n_types, int) or isinstance(n_types, bool) or n_types <= 0:
            raise MinferError(f"{gf.path}: metadata key 'tokenizer.ggml.token_type_count' is "
                              f"{'missing' if n_types is None else repr(n_types)[:40]}: bert needs the count of token "
                              "types (llama.cpp's loader refuses the file too)")
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        position_embd = load_qweight(gf, "position_embd.weight", device, (cfg.context_length, D), dense=False,
                                     dtype=dtype)
        type_row = None
        if "token_types.weight" in gf.tensors:
            t = gf.tensor("token_types.weight")
            if tuple(t.shape) != (n_types, D):
                raise MinferError(f"{gf.path}: tensor 'token_types.weight' has shape {tuple(t.shape)}, expected "
                                  f"({n_types}, {D}) (tokenizer.ggml.token_type_count, embedding_length)")
            type_row = load_dense(gf, "token_types.weight")[0].float().to(device)
        embd_norm = load_vector(gf, "token_embd_norm.weight", device, D)
        embd_norm_b = load_vector(gf, "token_embd_norm.bias", device, D)
        blocks = [cls.load_block(gf, cfg, i, device, dtype) for i in range(cfg.n_layers)]
        model = cls(cfg, token_embd, position_embd, type_row, embd_norm, embd_norm_b, blocks, act_dtype=act_dtype)
        model.rank_head = load_rank_head(gf, D, cls.arch)
        return model

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> BertBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw, kv_out = t.w, t.v, t.opt, t.D, t.F, t.kv_out
        return BertBlock(
            attn_q=w("attn_q", (D, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
            attn_q_b=opt("attn_q.bias", D), attn_k_b=opt("attn_k.bias", kv_out), attn_v_b=opt("attn_v.bias", kv_out),
            attn_output=w("attn_output", (D, D)), attn_output_b=opt("attn_output.bias", D),
            attn_output_norm=v("attn_output_norm.weight", D), attn_output_norm_b=v("attn_output_norm.bias", D),
            ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=opt("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=opt("ffn_down.bias", D),
            layer_output_norm=v("layer_output_norm.weight", D), layer_output_norm_b=v("layer_output_norm.bias", D))

    # ---- declarations (minfer.models.base.Model) ----

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd, self.position_embd]
        for b in self.blocks:
            ws += b.matrices()
        return ws

    def linear_groups(self) -> list[tuple]:
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.blocks]

    def head_weights(self) -> list:
        return [self.token_embd, self.position_embd]

    def head(self, h: torch.Tensor, ctx, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden rows to an embeddings run (Model.head); anything else asked logits, which an encoder has not."""
        if self.hidden_sink is None:
            raise MinferError(f"{self.arch} is an encoder (bidirectional attention, no lm head): it only embeds; "
                              "use `minfer embed`, Engine.embed or the server's /v1/embeddings")
        return super().head(h, ctx, bias)

    # ---- the forward ----

    def check_step(self, step: Step, cache) -> None:
        """MinferError for a step that does not start at position 0 (an encoder's input is one forward), a context
        (--ctx) past the position table, or (on the CPU) a position past it."""
        if step.start != 0:
            raise MinferError(f"{self.arch} is an encoder: its attention sees the whole input, which must go through "
                              f"one forward from position 0 (this step starts at {step.start})")
        StarcoderModel.check_positions(self, step, cache)   # the learned position table's bounds, as starcoder's

    def input_rows(self, tokens: torch.Tensor, step: Step) -> torch.Tensor:
        """The summed input embeddings before the embedding norm: token + token type 0 + position, (T, D) float32."""
        x = ops.embedding(tokens, self.token_embd).float() + ops.embedding(step.positions, self.position_embd).float()
        return x if self.type_row is None else x + self.type_row

    def attention(self, h: torch.Tensor, blk: BertBlock, ctx) -> torch.Tensor:
        """h (T, D) -> W_o attn(q, k, v) + b_o (T, D), attention over every row of h."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (blk.attn_q_b, blk.attn_k_b, blk.attn_v_b),
                                  ctx)
        o = bidirectional_attention(q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), Dh ** -0.5)
        return ops.linear(o, blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: BertBlock, ctx) -> torch.Tensor:
        """W_down gelu_tanh(W_up h + b_up) + b_down, (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(F.gelu(u.float(), approximate="tanh").to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at positions 0..T-1 -> the hidden rows step.logits names, handed to an embeddings run
        (Model.head); the cache is not used. x: the float32 stream, normed after each residual add."""
        self.check_step(step, cache)
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = layer_norm(self.input_rows(tokens, step), self.embd_norm, self.embd_norm_b, eps, torch.float32)
        for i, blk in enumerate(self.blocks):
            a = self.attention(x.to(act), blk, ctx).float()
            if i == last:     # bert.cpp: the last layer's adds, norms and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = layer_norm(x + a, blk.attn_output_norm, blk.attn_output_norm_b, eps, torch.float32)
            f = self.mlp(x.to(act), blk, ctx).float()
            x = layer_norm(x + f, blk.layer_output_norm, blk.layer_output_norm_b, eps, torch.float32)
        return self.head(x, ctx)
