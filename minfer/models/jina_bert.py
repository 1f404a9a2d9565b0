"""Jina BERT v2 encoders (jinaai's remote-code JinaBert: jina-embeddings-v2-base-en / -small-en / -base-code, the
jina-reranker-v1-tiny / -turbo cross-encoders): the GGUF arch `jina-bert-v2`. BERT's post-norm layers
(minfer/models/bert.py) with ALiBi instead of a position table and a gated GELU MLP; embeddings only:

    x_0 = LN(E[tokens] + T[0]; token_embd_norm)                  no position table, no rope
    for each layer l:
        q, k, v = W_q x + b_q, W_k x + b_k, W_v x + b_v           (q, k LayerNormed when the file has the norms)
        a = W_o softmax(q k^T / sqrt(Dh) - m_h |i - j|) v + b_o    ALiBi, over ALL tokens (bidirectional)
        h = LN(x + a; attn_output_norm)
        h = LN(h + x; attn_norm_2)                                 only where the file has attn_norm_2 (-code)
        x = LN(h + W_down glu(h) + b_down; layer_output_norm)
    hidden = x

Each rule and its source (llama.cpp src/models/jina-bert-v2.cpp load_arch_hparams / load_arch_tensors; the graph is
bert's: src/models/models.h `llama_model_jina_bert_v2::graph = llama_model_bert::graph`, src/models/bert.cpp;
src/llama-graph.cpp llm_graph_input_attn_no_cache::set_input, build_attn_mha, build_ffn, build_pooling;
ggml-cpu ops.cpp ggml_compute_forward_soft_max_f32, ggml_compute_forward_geglu_f32; src/llama-model.cpp
create_tensor_qkv, llama_model_rope_type, create_memory; conversion/bert.py JinaBertV2Model; gguf-py
tensor_mapping.py's "jina" rows):
- The input: the token's row plus row 0 of `token_types.weight` (required here: jina-bert-v2.cpp creates it with flag
  0, shape (token_type_count, D); bert.cpp "token types are hardcoded to zero"), then LayerNorm with weight and bias
  (token_embd_norm). No position rows: bert.cpp adds pos_embd only for LLM_ARCH_BERT and builds no inp_pos for
  JINA_BERT_V2; llama_model_rope_type: JINA_BERT_V2 -> NONE (rope_style "normal" is declared for the registry only).
- Positions enter through ALiBi only: the attention mask of a no-cache (encoder) graph holds -|p_i - p_j| for every
  pair (set_input: `hparams.use_alibi ? -std::abs(p0 - p1) : 0.0f`, use_alibi since f_max_alibi_bias > 0), and
  ggml_soft_max_ext(kq, mask, 1/sqrt(Dh), max_bias) adds it times the head's slope to the scaled scores. max_bias is
  8 for every file (load_arch_hparams: `hparams.f_max_alibi_bias = 8.0f`, no key read); the slopes are ggml's
  (ops.reference.alibi_slopes: m0^(h+1) for the first 2^floor(log2 H) heads, then m1^(2k+1)), which are HF JinaBert's
  _get_alibi_head_slopes, the extra heads of a head count that is not a power of two (12 in the base models)
  included. Symmetric: key j before or after query i costs the same. Scale 1/sqrt(head_dim); no KV cache
  (create_memory: none for JINA_BERT_V2); the context may pass `context_length` (no table bounds it).
  The scores are computed in float32 with the bias, query rows in chunks (ALIBI_SCORE_BYTES), on both backends:
  counted as the path attention.alibi.torch (as bloom / mpt's).
- q/k/v: separate attn_q / attn_k / attn_v with optional biases (what the converter writes from HF query / key /
  value) or a fused attn_qkv (create_tensor_qkv takes either: the fused rows q, k, v; its bias, or the three
  biases). attn_output (D, D) and its bias are required (flag 0).
- The q / k LayerNorms (-code's layer_norm_q / layer_norm_k; bert.cpp `if (model.layers[il].attn_q_norm)`): after
  the projection and its bias, over the whole projection (all heads together, shape (D,)), with weight and the
  optional bias, eps as the others. Absent in the en models.
- Post-norm residuals: LN(x + attention; attn_output_norm); where `attn_norm_2` exists (-code's layer_norm_1) the
  layer input is added AGAIN and normed (bert.cpp: `cur = ggml_add(ctx0, cur, inpL)` then build_norm(attn_norm_2));
  then LN(that + MLP; layer_output_norm). Every norm a LayerNorm with weight and bias, eps
  `jina-bert-v2.attention.layer_norm_epsilon` (load_arch_hparams, required).
- The MLP, chosen per layer by the file (bert.cpp's JINA_BERT_V2 branch: up_contains_gate = no ffn_gate and ffn_up's
  rows != feed_forward_length; load_arch_tensors asserts ffn_up has F or 2F rows):
  * ffn_up (2F, D), no ffn_gate (the converter's layout since llama.cpp PR 14090: HF `mlp.gated_layers`, -code's
    `mlp.up_gated_layer`): LLM_FFN_GEGLU, ggml_geglu (not swapped) = gelu(FIRST half) * second half, ffn_up's
    optional (2F,) bias added before the split.
  * ffn_gate (F, D) and ffn_up (F, D) (older files: gated_layers_w / gated_layers_v): LLM_FFN_GELU with LLM_FFN_PAR
    = gelu(W_gate h) * (W_up h + b_up) (ggml_geglu_split; no gate bias exists).
  * ffn_up (F, D), no gate (feed_forward_type "original", PR 18475): gelu(W_up h + b_up).
  then W_down (.) + b_down (both required). GELU is the tanh form (ggml_gelu's formula; on llama.cpp's CPU a float16
  table, GGML_GELU_FP16), where HF JinaBert's nn.GELU / ACT2FN["gelu"] is the exact erf: on the fixtures the hidden
  rows move by ~4e-4 of their largest value (tools/gen_jina_fixture.py). minfer follows llama.cpp.
  NOTE, -code: HF's JinaBertGLUMLP for `up_gated_layer` computes `up * act(gated)` with up the FIRST half, and
  llama.cpp's converters before PR 14090 split it that way (first half -> ffn_up, second -> ffn_gate: PR 7596); this
  converter keeps it stacked and the graph puts the GELU on the first half, as for the en models' gated_layers
  (gate first). minfer computes what llama.cpp computes (its goldens are the reference), so a -code file converted
  by this converter gives llama.cpp's numbers, not transformers' (tools/gen_jina_fixture.py measures the two 1.2
  apart on the -code fixture); files with the gate apart (older conversions) give transformers' function.
- The last layer's adds, norms and MLP on the output rows only (bert.cpp inp_out_ids); the rows after the last
  layer_output_norm are the embeddings (res->t_embd). No lm head (BertModel.head refuses generation).
- A reranker (jina-reranker-v1: HF `classifier` Linear(D, 1)) carries `cls.weight` (1, D) and `cls.bias` (1,)
  (load_arch_tensors: cls {n_embd, 1}, cls_b {1}, both TENSOR_NOT_REQUIRED; no cls.output for this arch), read into
  bert's RankHead: build_pooling RANK takes the [CLS] row (the first: non-causal), or the rows' mean with
  `jina-bert-v2.classifier.pooling_type` 1, then tanh(cls x + cls_b) (build_pooling: a tanh after `cls` for every
  arch but modern-bert): one score in (-1, 1), llama-server's relevance_score. An HF pooler is dropped by the
  converter (BertModel.filter_tensors); the score is llama.cpp's function, checked against llama.cpp and against the
  generator's torch forward of that function, not against transformers' remote-code head.
- Any other tensor is refused by name (llama.cpp's loader refuses a file with a tensor it did not create: "wrong
  number of tensors"), and so is a bias without its weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.bert import RankHead
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertModel, layer_norm_b, token_type_row
from minfer.ops.reference import alibi_slopes, softcapped_attention
from minfer.weights import QWeight, load_dense, load_qweight, load_vector

MAX_ALIBI_BIAS = 8.0               # jina-bert-v2.cpp load_arch_hparams: hparams.f_max_alibi_bias = 8.0f
ALIBI_SCORE_BYTES = 128 << 20      # the float32 scores (H, rows, T) one chunk of query rows writes out
MLP_KINDS = ("geglu", "gated", "gelu")   # stacked gate+up / gate apart / plain GELU (module doc)


@dataclass
class JinaBertBlock:
    attn_q: QWeight | None                   # (D, D); None with a fused attn_qkv
    attn_k: QWeight | None                   # (Hkv*Dh, D)
    attn_v: QWeight | None
    attn_q_b: torch.Tensor | None
    attn_k_b: torch.Tensor | None
    attn_v_b: torch.Tensor | None
    attn_qkv: QWeight | None                 # (D + 2 Hkv*Dh, D): q, k, v rows
    attn_qkv_b: torch.Tensor | None
    attn_q_norm: torch.Tensor | None         # (D,) LayerNorm over the whole q projection (-code)
    attn_q_norm_b: torch.Tensor | None
    attn_k_norm: torch.Tensor | None
    attn_k_norm_b: torch.Tensor | None
    attn_output: QWeight                     # (D, D)
    attn_output_b: torch.Tensor
    attn_output_norm: torch.Tensor
    attn_output_norm_b: torch.Tensor
    attn_norm_2: torch.Tensor | None         # (D,): the layer input added again and normed (-code)
    attn_norm_2_b: torch.Tensor | None
    mlp: str                                 # one of MLP_KINDS
    ffn_up: QWeight                          # (2F, D) for geglu, else (F, D)
    ffn_up_b: torch.Tensor | None
    ffn_gate: QWeight | None                 # (F, D) for gated, else None
    ffn_down: QWeight                        # (D, F)
    ffn_down_b: torch.Tensor
    layer_output_norm: torch.Tensor
    layer_output_norm_b: torch.Tensor

    def matrices(self) -> list[QWeight]:
        qkv = [self.attn_qkv] if self.attn_qkv is not None else [self.attn_q, self.attn_k, self.attn_v]
        return qkv + [w for w in (self.attn_output, self.ffn_gate, self.ffn_up, self.ffn_down) if w is not None]


def alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, positions: torch.Tensor,
                    slopes: torch.Tensor) -> torch.Tensor:
    """softmax(scale q k^T - slopes[h] |p_i - p_j|) v over every key of the input, in float32: q (T, H, Dh), k / v
    (T, Hkv, Dh) (query head h reads kv head h // (H / Hkv)), positions (T,) -> (T, H * Dh) in q's dtype. The query
    rows go in chunks so the written-out scores stay under ALIBI_SCORE_BYTES."""
    ops.paths.count("attention.alibi.torch")
    T, H, Dh = q.shape
    qh, kh, vh = (x.transpose(0, 1).float() for x in (q, k, v))        # (H, T, Dh), (Hkv, T, Dh)
    pos = positions.to(q.device)
    m = slopes.to(device=q.device, dtype=torch.float32)
    rows = max(1, ALIBI_SCORE_BYTES // (4 * H * T))
    out = torch.empty((H, T, Dh), dtype=torch.float32, device=q.device)
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        dist = (pos[r0:r1, None] - pos[None, :]).abs().float()         # (rows, T)
        bias = -m[:, None, None] * dist[None]                            # (H, rows, T): the mask times the slope
        out[:, r0:r1] = softcapped_attention(qh[:, r0:r1].contiguous(), kh, vh, None, 0.0, None, scale, bias)
    return out.transpose(0, 1).reshape(T, H * Dh).to(q.dtype)


def load_jina_rank_head(gf, D: int, arch: str) -> RankHead | None:
    """jina-bert-v2's classifier (module doc): cls.weight (1, D) + cls.bias (1,), None without them."""
    w = b = None
    if "cls.weight" in gf.tensors:
        got = tuple(int(d) for d in gf.tensor("cls.weight").shape)
        if got not in ((1, D), (D,)):
            raise MinferError(f"{gf.path}: tensor 'cls.weight' has shape {got}, expected (1, {D}) (llama.cpp's "
                              f"{arch} loader: cls {{n_embd, 1}}, one score)")
        w = load_dense(gf, "cls.weight").reshape(1, D).float()
    if "cls.bias" in gf.tensors:
        if w is None:
            raise MinferError(f"{gf.path}: tensor 'cls.bias' without 'cls.weight'")
        got = tuple(int(d) for d in gf.tensor("cls.bias").shape)
        if got != (1,):
            raise MinferError(f"{gf.path}: tensor 'cls.bias' has shape {got}, expected (1,)")
        b = load_dense(gf, "cls.bias").reshape(1).float()
    if w is None:
        return None
    labels = gf.metadata.get(f"{arch}.classifier.output_labels")
    labels = [str(x) for x in labels] if isinstance(labels, list) else []
    mean = gf.metadata.get(f"{arch}.classifier.pooling_type") == 1     # llama_pooling_type MEAN
    meta = {k: gf.metadata.get(k) for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                            "tokenizer.ggml.add_sep_token", "tokenizer.chat_template.rerank")}
    return RankHead(cls=w, cls_b=b, cls_out=None, cls_out_b=None, labels=labels, mean=mean, pair_meta=meta)


class JinaBertV2Model(NomicBertModel):
    arch = "jina-bert-v2"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_JINA_BERT_V2 -> NONE (never applied: ALiBi)

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, type_row: torch.Tensor, embd_norm: torch.Tensor,
                 embd_norm_b: torch.Tensor, blocks: list[JinaBertBlock], act_dtype: torch.dtype = torch.float32):
        super().__init__(cfg, token_embd, type_row, embd_norm, embd_norm_b, blocks, act_dtype=act_dtype)
        self.slopes = alibi_slopes(cfg.n_heads, MAX_ALIBI_BIAS).to(embd_norm.device)    # (H,) float32

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "JinaBertV2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, arch = cfg.vocab, cfg.d_model, cls.arch
        if cfg.n_heads * cfg.head_dim != D:
            raise MinferError(f"{gf.path}: {arch} needs head_count * head size == embedding_length (q and the output "
                              f"projection are (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {D}")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {arch}.feed_forward_length is {cfg.ffn}: expected > 0")
        cls.check_tensor_names(gf, cfg)
        type_row = token_type_row(gf, D, device, arch)
        if type_row is None:
            raise MinferError(f"{gf.path}: tensor 'token_types.weight' is missing: {arch} needs it (llama.cpp's "
                              "jina-bert-v2 loader creates it as required; token type 0's row is added to every token)")
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        embd_norm = load_vector(gf, "token_embd_norm.weight", device, D)
        embd_norm_b = load_vector(gf, "token_embd_norm.bias", device, D)
        blocks = [cls.load_block(gf, cfg, i, device, dtype) for i in range(cfg.n_layers)]
        model = cls(cfg, token_embd, type_row, embd_norm, embd_norm_b, blocks, act_dtype=act_dtype)
        model.rank_head = load_jina_rank_head(gf, D, arch)
        return model

    @classmethod
    def check_tensor_names(cls, gf, cfg: ModelConfig) -> None:
        """MinferError naming the first tensor llama.cpp's jina-bert-v2 loader would not create (module doc)."""
        known = {"token_embd.weight", "token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias",
                 "cls.weight", "cls.bias"}
        per_layer = [f"{n}.{s}" for n in ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                                          "attn_output", "attn_output_norm", "attn_norm_2", "ffn_up", "ffn_down",
                                          "layer_output_norm") for s in ("weight", "bias")] + ["ffn_gate.weight"]
        for i in range(cfg.n_layers):
            known |= {f"blk.{i}.{n}" for n in per_layer}
        for name in gf.tensors:
            if name not in known:
                raise MinferError(f"{gf.path}: tensor '{name}' is not part of a {cls.arch} model (llama.cpp's loader "
                                  "refuses the file too: it creates no such tensor)")

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> JinaBertBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw, kv_out = t.w, t.v, t.opt, t.D, t.F, t.kv_out
        for n in ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_norm_2", "ffn_up"):
            if t.has(f"{n}.bias") and not t.has(f"{n}.weight"):
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{n}.bias' without 'blk.{i}.{n}.weight'")
        qkv = dict(attn_q=None, attn_k=None, attn_v=None, attn_q_b=None, attn_k_b=None, attn_v_b=None, attn_qkv=None,
                   attn_qkv_b=None)
        if t.has("attn_qkv.weight"):
            n = D + 2 * kv_out
            qkv.update(attn_qkv=w("attn_qkv", (n, D)), attn_qkv_b=opt("attn_qkv.bias", n))
            if qkv["attn_qkv_b"] is None and any(t.has(f"attn_{x}.bias") for x in "qkv"):
                # create_tensor_qkv: fused weights with separate q/k/v biases (each optional; a missing one is zero)
                qkv["attn_qkv_b"] = torch.cat([opt("attn_q.bias", D, zero=True), opt("attn_k.bias", kv_out, zero=True),
                                               opt("attn_v.bias", kv_out, zero=True)])
        else:
            qkv.update(attn_q=w("attn_q", (D, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                       attn_q_b=opt("attn_q.bias", D), attn_k_b=opt("attn_k.bias", kv_out),
                       attn_v_b=opt("attn_v.bias", kv_out))
        if t.has("attn_k_norm.weight") and kv_out != D:
            raise MinferError(f"{gf.path}: tensor 'blk.{i}.attn_k_norm.weight' with {cfg.n_kv_heads} kv heads: "
                              f"llama.cpp's {cls.arch} loader creates the k norm over embedding_length {D}, which a "
                              f"k projection of {kv_out} cannot take")
        has_gate = t.has("ffn_gate.weight")
        up_rows = int(gf.tensor(f"blk.{i}.ffn_up.weight").shape[0]) if t.has("ffn_up.weight") else Fw
        if up_rows not in (Fw, 2 * Fw) or (has_gate and up_rows != Fw):
            want = f"{Fw} (feed_forward_length, with ffn_gate)" if has_gate else \
                f"{Fw} (feed_forward_length) or {2 * Fw} (gate and up stacked)"
            raise MinferError(f"{gf.path}: tensor 'blk.{i}.ffn_up.weight' has {up_rows} rows, expected {want} "
                              f"(llama.cpp's {cls.arch} loader asserts n_ffn_up == n_ff || n_ffn_up == n_ff * 2)")
        kind = "gated" if has_gate else ("geglu" if up_rows == 2 * Fw else "gelu")
        return JinaBertBlock(
            **qkv,
            attn_q_norm=opt("attn_q_norm.weight", D), attn_q_norm_b=opt("attn_q_norm.bias", D),
            attn_k_norm=opt("attn_k_norm.weight", D), attn_k_norm_b=opt("attn_k_norm.bias", D),
            attn_output=w("attn_output", (D, D)), attn_output_b=v("attn_output.bias", D),
            attn_output_norm=v("attn_output_norm.weight", D), attn_output_norm_b=v("attn_output_norm.bias", D),
            attn_norm_2=opt("attn_norm_2.weight", D), attn_norm_2_b=opt("attn_norm_2.bias", D),
            mlp=kind, ffn_up=w("ffn_up", (up_rows, D)), ffn_up_b=opt("ffn_up.bias", up_rows),
            ffn_gate=w("ffn_gate", (Fw, D)) if has_gate else None,
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D),
            layer_output_norm=v("layer_output_norm.weight", D), layer_output_norm_b=v("layer_output_norm.bias", D))

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: JinaBertBlock, ctx, positions: torch.Tensor | None = None,
                  rope=None, window: int = 0) -> torch.Tensor:
        """h (T, D) -> W_o attn(q, k, v) + b_o (T, D): q and k normed where the file says, ALiBi over every row."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = self.qkv(h, blk, ctx)
        if blk.attn_q_norm is not None:
            q = layer_norm_b(q.float(), blk.attn_q_norm, blk.attn_q_norm_b, c.rms_eps)
        if blk.attn_k_norm is not None:
            k = layer_norm_b(k.float(), blk.attn_k_norm, blk.attn_k_norm_b, c.rms_eps)
        if positions is None:
            positions = torch.arange(T, device=h.device)
        o = alibi_attention(q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), Dh ** -0.5, positions,
                            self.slopes)
        return ops.linear(o.to(h.dtype), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: JinaBertBlock, ctx) -> torch.Tensor:
        """W_down glu(h) + b_down, (T, D) -> (T, D), the layer's kind of GLU (module doc)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx).float()
        if blk.mlp == "geglu":           # ggml_geglu: gelu(first half) * second half
            a, g = u.chunk(2, dim=-1)
            m = F.gelu(a, approximate="tanh") * g
        elif blk.mlp == "gated":         # ggml_geglu_split(gate, up)
            m = F.gelu(ops.linear(h, blk.ffn_gate, None, ctx).float(), approximate="tanh") * u
        else:
            m = F.gelu(u, approximate="tanh")
        return ops.linear(m.to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) at positions 0..T-1 -> the hidden rows step.logits names, handed to an embeddings run."""
        self.check_step(step, cache)
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = layer_norm_b(self.input_rows(tokens, step), self.embd_norm, self.embd_norm_b, eps)
        for i, blk in enumerate(self.blocks):
            a = self.attention(x.to(act), blk, ctx, step.positions).float()
            if i == last:     # bert.cpp: the last layer's adds, norms and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            h = layer_norm_b(x + a, blk.attn_output_norm, blk.attn_output_norm_b, eps)
            if blk.attn_norm_2 is not None:    # bert.cpp: re-add the layer input, then attn_norm_2
                h = layer_norm_b(h + x, blk.attn_norm_2, blk.attn_norm_2_b, eps)
            f = self.mlp(h.to(act), blk, ctx).float()
            x = layer_norm_b(h + f, blk.layer_output_norm, blk.layer_output_norm_b, eps)
        return self.head(x, ctx)
