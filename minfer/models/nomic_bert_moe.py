"""Nomic BERT MoE encoders (nomic-embed-text-v2-moe: HF NomicBertModel with `moe_every_n_layers` > 0): the GGUF arch
`nomic-bert-moe`. An encoder for embeddings only: nomic-bert's layers (minfer/models/nomic_bert.py: rotary positions,
post-norm, bidirectional attention) with a GELU MLP, and on every other layer a mixture of ungated GELU experts:

    x_0 = LN(E[tokens] + T[0]; token_embd_norm)                  no position table
    for each layer l:
        q, k, v = split(W_qkv x + b_qkv)                           rope (NEOX) on q and k at positions 0..T-1
        x = LN(x + W_o attn(q, k, v) + b_o; attn_output_norm)      attention over ALL tokens (bidirectional)
        dense l:  f = W_down gelu(W_up x + b_up) + b_down
        MoE l:    p = softmax(W_router x) over the E experts; S = the k largest p (k = expert_used_count)
                  f = sum_{e in S} p_e W_down[e] gelu(W_up[e] x)      (weights NOT renormalized, no biases)
        x = LN(x + f; layer_output_norm)
    hidden = x

Each rule and its source (llama.cpp src/models/nomic-bert-moe.cpp load_arch_hparams / load_arch_tensors; the graph is
bert's, src/models/bert.cpp; src/llama-graph.cpp build_moe_ffn, build_ffn, build_pooling; src/llama-model.cpp
load_hparams, llama_model_rope_type, create_memory; conversion/bert.py NomicBertModel; gguf-py tensor_mapping):
- What nomic-bert does, this does (nomic_bert.py's rules, each cited there): token + token type 0's row, LayerNorm
  (token_embd_norm, weight and bias), no position table; fused attn_qkv (or attn_q/k/v) split q, k, v; rope NEOX
  (llama_model_rope_type lists LLM_ARCH_NOMIC_BERT_MOE under NEOX; bert.cpp rotates q and k for it), base
  `nomic-bert-moe.rope.freq_base`; softmax over every key, scale 1/sqrt(head_dim), no KV cache (create_memory: none
  for NOMIC_BERT_MOE); post-norm residuals; the last layer's adds, norms and FFN on the output rows only
  (inp_out_ids); the rows after the last layer_output_norm are the embeddings (res->t_embd).
- Biases (the converter asserts qkv_proj_bias, mlp_fc1_bias and mlp_fc2_bias are true for the MoE variant): attn_qkv
  and attn_output biases optional (create_tensor_qkv, TENSOR_NOT_REQUIRED); the dense layers' ffn_up.bias and
  ffn_down.bias optional and ADDED (unlike nomic-bert's SwiGLU branch).
- The dense MLP: bert.cpp's branch `model.arch == LLM_ARCH_BERT || LLM_ARCH_NOMIC_BERT_MOE || ...`:
  build_ffn(ffn_up, ffn_up_b, ffn_down, ffn_down_b, LLM_FFN_GELU, LLM_FFN_SEQ): no gate (ffn_gate is never created,
  so a file with one is refused by name). GELU is ggml_gelu, the tanh form; llama.cpp's CPU reads it from a float16
  table (ggml-cpu vec.h GGML_GELU_FP16: f16 of gelu(f16(x))), a few 1e-4 of the vectors apart from the formula on the
  fixture; minfer computes the formula (torch's tanh GELU), as models/bert.py does.
- Which layers are MoE: `moe_every_n_layers > 0 && il % moe_every_n_layers == 1` (load_arch_tensors and the graph;
  the released model: n = 2, layers 1, 3, ..., 11). `nomic-bert-moe.moe_every_n_layers` is optional (get_key with
  default 0: then every layer is dense); n = 1 makes no layer MoE (i % 1 is never 1), as in llama.cpp.
- A MoE layer's tensors (load_arch_tensors, flag 0): ffn_gate_inp (E, D) the router, ffn_up_exps (E, F, D),
  ffn_down_exps (E, D, F), with F = feed_forward_length (n_ff: the experts are as wide as the dense MLP) and
  E = `nomic-bert-moe.expert_count` (load_hparams LLM_KV_EXPERT_COUNT); no dense ffn_up / ffn_down there. The converter
  writes them from mlp.router.layer and mlp.experts.mlp.w1 / w2 (w1 viewed (E, F, D); w2 viewed (E, F, D) and
  transposed to (E, D, F): NomicBertModel.modify_tensors) and DROPS mlp.experts.bias (filter_tensors), and the graph
  passes no expert bias: so none is added here, and a file carrying ffn_*_exps.bias is refused by name.
- The MoE FFN (bert.cpp: build_moe_ffn(cur, ffn_gate_inp, ffn_up_exps, nullptr, ffn_down_exps, nullptr, n_expert,
  n_expert_used, LLM_FFN_GELU, false, hparams.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, il)):
  logits = W_router x in float32; probs = ggml_soft_max over the E experts; the k = `expert_used_count` largest
  (ggml_argsort_top_k); each chosen expert's weight is its softmax probability over ALL E experts (norm_w false: not
  divided by the chosen ones' sum); no gate_exps, so each expert is ungated: ggml_gelu(W_up[e] x) (the LLM_FFN_GELU
  case without a gate), then W_down[e], times its weight, summed over the k slots. expert_weights_scale is never read
  by this architecture's load_arch_hparams (0: no scaling), so the file's key, if any, is ignored here too; the
  gating is hardcoded softmax (config.py refuses an `expert_gating_func` other than softmax for this class); expert
  groups (`expert_group_count` > 1, which build_moe_ffn would apply) are refused.
- The router is minfer's MoE routing of the decoders (minfer.ops.reference.route: softmax over E, top-k, norm off;
  torch ops only, so on either device). ops.moe_ffn has no ungated GELU expert (its acts: silu, swiglu_oai, geglu,
  relu2), so the experts run here: each expert's rows of the stacked tensors are a QWeight of their own (F, D) /
  (D, F) (load_expert_rows), multiplied by ops.linear over the rows routed to that expert, the products weighted and
  added in float32. The per-expert row counts are read to the host once per MoE layer (an encoder's forward is one
  eager prefill, never captured in a CUDA graph: runtime/embed.py). On CUDA each expert is an ordinary matrix to
  ops.linear (the same (F, D) / (D, F) shapes as a dense MLP's), so no MoE kernel's width rule applies.
- The context may go past `context_length` (512 for the released model: the converter's n_positions 2048 ->
  512; no position table bounds it, llama.cpp warns only). The vocabulary is XLM-R's Unigram (tokenizer.ggml.model
  t5: minfer/tokenizer/ugm.py; <mask> strips the space before it for this arch: tokenizer.py). Pooling is the file's
  `nomic-bert-moe.pooling_type` (mean for the released GGUFs: the converter reads sentence-transformers' 1_Pooling).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import BlockTensors
from minfer.models.nomic_bert import NomicBertBlock, NomicBertModel, qkv_tensors
from minfer.ops.reference import route
from minfer.weights import QWeight, load_dense, load_qweight


def gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml_gelu's formula, the tanh form, in float32 (bert.cpp's LLM_FFN_GELU: dense and expert MLPs alike)."""
    return F.gelu(x.float(), approximate="tanh")


@dataclass
class NomicBertMoeBlock(NomicBertBlock):
    gate_inp: torch.Tensor | None = None          # (E, D) float32: the router (MoE layers only)
    up_exps: list[QWeight] | None = None          # E x (F, D)
    down_exps: list[QWeight] | None = None        # E x (D, F)

    @property
    def moe(self) -> bool:
        return self.gate_inp is not None

    def matrices(self) -> list[QWeight]:
        qkv = [self.attn_qkv] if self.attn_qkv is not None else [self.attn_q, self.attn_k, self.attn_v]
        ffn = [*self.up_exps, *self.down_exps] if self.moe else [self.ffn_up, self.ffn_down]
        return qkv + [self.attn_output] + ffn


class _ExpertRows:
    """A GGUFFile stand-in that shows expert e's rows of a stacked (E, N, K) tensor as a 2-D (N, K) tensor of its
    own (its whole rows of blocks, a slice of the file's map), for load_qweight / load_dense."""

    def __init__(self, gf, info, e: int, n: int):
        self.path = gf.path
        per = info.n_bytes // info.shape[0]
        self._info = replace(info, shape=(n, info.shape[-1]), n_elements=n * info.shape[-1], n_bytes=per,
                             offset=info.offset + e * per, data=info.data[e * per:(e + 1) * per])

    def tensor(self, name):
        return self._info


def load_expert_rows(gf, name: str, device, shape: tuple[int, int, int], dtype=torch.float32) -> list[QWeight]:
    """A stacked expert tensor (E, N, K) (ggml ne {K, N, E}) as E QWeights (N, K), expert e's named
    '<name>[expert e]'; MinferError naming the tensor for another shape."""
    E, N, K = shape
    info = gf.tensor(name)
    if tuple(info.shape) != (E, N, K):
        raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, expected {(E, N, K)} "
                          "(expert_count, rows, columns)")
    return [load_qweight(_ExpertRows(gf, info, e, N), f"{name}[expert {e}]", device, (N, K), dtype=dtype)
            for e in range(E)]


class NomicBertMoeModel(NomicBertModel):
    arch = "nomic-bert-moe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_NOMIC_BERT_MOE -> NEOX (applied: bert.cpp's rope branch)

    @staticmethod
    def moe_every(gf) -> int:
        """`nomic-bert-moe.moe_every_n_layers` (absent: 0, no MoE layer), checked."""
        n = gf.metadata.get("nomic-bert-moe.moe_every_n_layers", 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MinferError(f"{gf.path}: metadata key 'nomic-bert-moe.moe_every_n_layers' is {n!r}: expected an "
                              "integer >= 0")
        return n

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NomicBertMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        every, E, k = cls.moe_every(gf), cfg.n_experts, cfg.n_experts_used
        moe = [i for i in range(cfg.n_layers) if every > 0 and i % every == 1]
        if moe and E <= 0:
            raise MinferError(f"{gf.path}: nomic-bert-moe.moe_every_n_layers={every} makes layers {moe} MoE layers, "
                              "but metadata key 'nomic-bert-moe.expert_count' is missing or 0")
        if E > 0 and not 0 < k <= E:
            raise MinferError(f"{gf.path}: nomic-bert-moe.expert_count={E}, expert_used_count={k}: expected "
                              "0 < expert_used_count <= expert_count (llama.cpp's load_hparams asserts it)")
        if cfg.expert_groups > 1:
            raise MinferError(f"{gf.path}: nomic-bert-moe.expert_group_count={cfg.expert_groups}: group-limited "
                              "routing is not supported for nomic-bert-moe")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> NomicBertMoeBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw = t.w, t.v, t.opt, t.D, t.F
        every = cls.moe_every(gf)
        is_moe = every > 0 and i % every == 1
        kind = (f"a MoE layer (moe_every_n_layers={every}: i % {every} == 1)" if is_moe else
                f"a dense layer (moe_every_n_layers={every})")
        absent = ["ffn_gate.weight", "ffn_gate.bias", "ffn_gate_exps.weight", "ffn_up_exps.bias", "ffn_down_exps.bias",
                  "ffn_gate_inp.bias"]
        absent += ["ffn_up.weight", "ffn_up.bias", "ffn_down.weight", "ffn_down.bias"] if is_moe else \
            ["ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"]
        for name in absent:
            if t.has(name):
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': layer {i} is {kind}, whose tensors llama.cpp's "
                                  "nomic-bert-moe loader creates (load_arch_tensors) do not include it; such a file "
                                  "is refused rather than run without it")
        common = dict(
            **qkv_tensors(t),
            attn_output=w("attn_output", (D, D)), attn_output_b=opt("attn_output.bias", D),
            attn_output_norm=v("attn_output_norm.weight", D), attn_output_norm_b=v("attn_output_norm.bias", D),
            layer_output_norm=v("layer_output_norm.weight", D), layer_output_norm_b=v("layer_output_norm.bias", D))
        if not is_moe:
            return NomicBertMoeBlock(**common, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=opt("ffn_up.bias", Fw),
                                     ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=opt("ffn_down.bias", D))
        E, p = cfg.n_experts, f"blk.{i}."
        router = gf.tensor(p + "ffn_gate_inp.weight")
        if tuple(router.shape) != (E, D):
            raise MinferError(f"{gf.path}: tensor '{p}ffn_gate_inp.weight' has shape {tuple(router.shape)}, expected "
                              f"{(E, D)} (expert_count, embedding_length)")
        return NomicBertMoeBlock(
            **common, ffn_up=None, ffn_up_b=None, ffn_down=None, ffn_down_b=None,
            gate_inp=load_dense(gf, p + "ffn_gate_inp.weight").float().to(device),
            up_exps=load_expert_rows(gf, p + "ffn_up_exps.weight", device, (E, Fw, D), dtype),
            down_exps=load_expert_rows(gf, p + "ffn_down_exps.weight", device, (E, D, Fw), dtype))

    # ---- the forward (NomicBertModel.forward calls mlp) ----

    def mlp(self, h: torch.Tensor, blk: NomicBertMoeBlock, ctx) -> torch.Tensor:
        """The layer's FFN of h (T, D) -> (T, D) in h's dtype: the experts on a MoE layer, else
        W_down gelu(W_up h + b_up) + b_down (LLM_FFN_GELU, LLM_FFN_SEQ)."""
        if blk.moe:
            return self.moe_ffn(h, blk, ctx)
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(gelu(u).to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def moe_ffn(self, h: torch.Tensor, blk: NomicBertMoeBlock, ctx) -> torch.Tensor:
        """build_moe_ffn as bert.cpp calls it (module doc): softmax routing over the E experts, the k largest, their
        probabilities as weights (not renormalized), sum_k w_k W_down[e_k] gelu(W_up[e_k] h). h (T, D) -> (T, D)."""
        T, D = h.shape
        w, idx = route(h, blk.gate_inp, self.cfg.n_experts_used, False, gating="softmax")   # (T, k) float32, int64
        k, flat = idx.shape[1], idx.reshape(-1)
        order = torch.argsort(flat, stable=True)                         # (token, slot) pairs by expert
        counts = torch.bincount(flat, minlength=len(blk.up_exps)).tolist()   # the one host read of the layer
        tok, wt = order // k, w.reshape(-1)[order]
        out = torch.zeros(T, D, dtype=torch.float32, device=h.device)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows, we = tok[start:start + n], wt[start:start + n]
            start += n
            a = gelu(ops.linear(h.index_select(0, rows), blk.up_exps[e], None, ctx)).to(h.dtype)
            out.index_add_(0, rows, ops.linear(a, blk.down_exps[e], None, ctx).float() * we[:, None])
        return out.to(h.dtype)
