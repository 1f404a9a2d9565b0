"""HRM-Text (danish-foundation-models/DFM-Mimir 1B, sapientinc/HRM-Text-1B): the GGUF arch `hrm_text`.

llama.cpp's converter (conversion/hrm_text.py HrmTextModel) takes HrmTextForCausalLM; the graph is
src/models/hrm-text.cpp; transformers' modeling_hrm_text.py is the model it follows.

    zH = s E[tokens]                                       token_embd (V, D), s = hrm_text.embedding_scale
    zL = z_L_init                                          hrm.z_l_init (D,), the same for every position
    for h in 0 .. H_cycles-1:
        for l in 0 .. L_cycles-1:  zL = L_stack(zH + zL)    blocks 0 .. lps-1
        zH = H_stack(zH + zL)                               blocks lps .. 2 lps-1
    logits = W_out zH                                      output (V, D), or token_embd when tied

    stack(x):  for each of its lps layers:
                   x = x + W_o (attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x)) * sigmoid(W_gate n(x)))
                   x = x + W_down(silu(W_gate' n(x)) * W_up n(x))
               return n(x)                                   n: RMSNorm without a weight

Each rule and its source:
- Two stacks of `hrm.layers_per_stack` (lps) layers each, their weights shared by every pass: the file holds
  blocks 0 .. lps-1 (the L stack, HF L_module.layers) and lps .. 2 lps-1 (the H stack, HF H_module.layers)
  (hrm_text.py modify_tensors: layer_idx + lps for "H"; hrm-text.cpp load_arch_tensors: the first L and H
  passes create the layers, the later passes alias them).
- The cycles: for each of `hrm.h_cycles` H cycles, `hrm.l_cycles` passes of zL = L_stack(zH + zL), then
  zH = H_stack(zH + zL); zL starts as hrm.z_l_init broadcast over the positions, zH as the scaled embedding
  (hrm-text.cpp graph(); HF HrmTextModel.forward). The output is zH after the last H pass: no output norm
  other than the H stack's own final norm, no other tensor.
- The KV cache slots: `block_count` is lps * h_cycles * (l_cycles + 1) (the converter's block_count; HF's
  num_hidden_layers after HrmTextConfig.__post_init__), one cache layer per attention invocation: pass (h, l)
  (l = l_cycles the H pass) uses slots (h * (l_cycles + 1) + l) * lps + j for its layer j (hrm-text.cpp
  slot_base; HF cycle_offset + layer_idx). Every cache of the engine (runtime/kv_cache.py, the batch engine's
  runtime/paged_kv.py) is allocated per cfg.n_layers = block_count, so the slots are its layers: paged_kv True.
  A file whose block_count is not that product is refused (hrm-text.cpp load_arch_hparams asserts it).
- The embedding times `hrm_text.embedding_scale` (llama-graph.cpp build_inp_embd: when != 0; the key is optional
  there, absent = not scaled; HF inputs_embeds * embedding_scale).
- Every norm is an RMSNorm without a weight: the layers' two pre-norms and each stack's final norm (hrm-text.cpp
  build_norm(cur, nullptr, ...); HF HrmTextRMSNorm has no parameter), eps attention.layer_norm_rms_epsilon.
- The attention gate: sigmoid(W_gate n(x)) (attn_gate (H Dh, D), from the layer's normed input) times the
  attention's merged heads before W_o (hrm-text.cpp ggml_mul(cur, sigmoid(gate)) then wo; HF
  torch.sigmoid(gate_proj(h)) * attn_output before o_proj); MHA (HF num_key_value_groups 1; the converter
  writes no head_count_kv), kq scale 1/sqrt(Dh), NEOX rope over rope.dimension_count (llama_model_rope_type:
  HRM_TEXT -> NEOX; HF rotate_half).
- The MLP: SwiGLU (hrm-text.cpp build_ffn LLM_FFN_SILU, LLM_FFN_PAR; HF HrmTextMLP).
- prefix_lm (`hrm.prefix_lm`, HF config.prefix_lm, True in the release): llama.cpp runs causal attention only
  (hrm-text.cpp load_arch_hparams: "prefix-LM prefill is not implemented", the key kept for round-trip), and so
  does minfer, for either value. transformers makes a block bidirectional only where the caller passes
  token_type_ids (1 = the instruction tokens) on the first forward; input_ids alone, and generate() without
  them, are causal there too, so those results are the same. A prompt that transformers runs with token_type_ids
  marking it (the instruction block bidirectional) gets other logits there than here: on the tiny fixture's model
  with its 8 prompt tokens marked, every position's logits move by 46-163% of their largest and the 16-token greedy
  continuation differs from the causal one at every token. minfer has no way to take such a mask; it is not emulated.
- q/k/v biases are taken when present (hrm-text.cpp create_tensor_qkv: TENSOR_NOT_REQUIRED); the converter writes
  none for the release (attention_bias False).
- Refused by name: a block_count other than the slot count, a missing or non-positive lps / cycle count, blocks
  other than 0 .. 2 lps-1, head_count_kv != head_count, a negative embedding scale, a fused attn_qkv, and any
  tensor the graph does not read (llama.cpp's loader: "wrong number of tensors"), e.g. a norm weight or an o /
  gate bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.afmoe import AfmoeModel
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, attention_heads, ffn_branch
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass
class HrmBlock(Block):
    """A layer of either stack: Block's attention and SwiGLU matrices (no norm weights) plus the attention gate."""

    attn_gate: QWeight | None = None   # (H*Dh, D)

    def matrices(self) -> list[QWeight]:
        return super().matrices() + [self.attn_gate]


def _positive_count(gf, key: str) -> int:
    """A required positive integer key (hrm-text.cpp load_arch_hparams: get_key, then GGML_ASSERT > 0)."""
    if key not in gf.metadata:
        raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the hrm_text model)")
    v = gf.metadata[key]
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v!r}, expected a positive integer")
    return v


class HrmTextModel(LlamaModel):
    arch = "hrm_text"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_HRM_TEXT -> NEOX
    paged_kv = True           # the cache slots are the cache's layers (module doc)

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, blocks: list[HrmBlock], output: QWeight,
                 z_l_init: torch.Tensor, cycles: tuple[int, int, int], embed_scale: float,
                 act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.act_dtype = act_dtype
        self.token_embd = token_embd
        self.blocks = blocks                     # the 2 lps physical layers: L stack, then H stack
        self.output = output
        self.z_l_init = z_l_init                 # (D,) float32
        self.lps, self.h_cycles, self.l_cycles = cycles
        self.embed_scale = embed_scale
        self.ones = torch.ones(cfg.d_model, dtype=torch.float32, device=z_l_init.device)   # the weightless norms
        self.output_norm = None

    @property
    def device(self) -> torch.device:
        return self.z_l_init.device

    @classmethod
    def block_passes(cls, gf) -> dict[int, int]:
        """The L stack's blocks run h_cycles * l_cycles times a forward, the H stack's h_cycles times (Model.block_passes;
        the hrm.* keys as read_cycles reads them, unchecked here: the bench reads a file it may not load)."""
        a = gf.architecture
        lps, hc, lc = (int(gf.get(f"{a}.hrm.{k}", 1) or 1) for k in ("layers_per_stack", "h_cycles", "l_cycles"))
        return {**{j: hc * lc for j in range(lps)}, **{lps + j: hc for j in range(lps)}}

    @classmethod
    def read_cycles(cls, gf, cfg: ModelConfig) -> tuple[int, int, int]:
        """(lps, h_cycles, l_cycles), checked against block_count (the slot count)."""
        a = cfg.arch
        lps, hc, lc = (_positive_count(gf, f"{a}.hrm.{k}") for k in ("layers_per_stack", "h_cycles", "l_cycles"))
        if cfg.n_layers != lps * hc * (lc + 1):
            raise MinferError(f"{gf.path}: metadata key '{a}.block_count' is {cfg.n_layers}, expected the KV-cache "
                              f"slot count hrm.layers_per_stack * hrm.h_cycles * (hrm.l_cycles + 1) = "
                              f"{lps} * {hc} * ({lc} + 1) = {lps * hc * (lc + 1)}")
        return lps, hc, lc

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "HrmTextModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cycles = cls.read_cycles(gf, cfg)
        n_blocks = 2 * cycles[0]
        if cfg.n_kv_heads != cfg.n_heads:
            raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.attention.head_count_kv' is {cfg.n_kv_heads}, "
                              f"expected head_count {cfg.n_heads} (HRM-Text's attention is MHA)")
        scale = gf.metadata.get(f"{cfg.arch}.embedding_scale", 0.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale == scale or scale < 0:
            raise MinferError(f"{gf.path}: metadata key '{cfg.arch}.embedding_scale' is {scale!r}, expected a "
                              "non-negative number")
        from minfer.metadata_check import blocks_present

        present = blocks_present(gf)                          # (metadata_check leaves hrm_text's blocks to this)
        if present != list(range(n_blocks)):
            raise MinferError(f"{gf.path}: the file has tensors for blocks {present}, expected blocks "
                              f"0..{n_blocks - 1}: 2 stacks of hrm.layers_per_stack {cycles[0]} (llama.cpp "
                              "hrm-text.cpp load_arch_tensors)")
        cls.refuse_unread_tensors(gf, cfg, n_blocks)
        V, D = cfg.vocab, cfg.d_model
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = [cls.load_block(gf, cfg, i, device, dtype) for i in range(n_blocks)]
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        z = load_vector(gf, "hrm.z_l_init", device, D)
        # llama-graph.cpp build_inp_embd scales only when f_embedding_scale != 0
        return cls(cfg, token_embd, blocks, output, z, cycles, float(scale) or 1.0, act_dtype=act_dtype)

    @classmethod
    def refuse_unread_tensors(cls, gf, cfg: ModelConfig, n_blocks: int) -> None:
        """Every tensor of the file is one the graph reads (llama.cpp's loader refuses the rest: "wrong number of
        tensors"); a fused attn_qkv (which create_tensor_qkv would take) is refused by name, as not supported."""
        known = {"token_embd.weight", "output.weight", "hrm.z_l_init"}
        for i in range(n_blocks):
            known |= {f"blk.{i}.{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "attn_gate", "attn_output",
                                                     "ffn_gate", "ffn_up", "ffn_down")}
            known |= {f"blk.{i}.attn_{n}.bias" for n in "qkv"}     # create_tensor_qkv: TENSOR_NOT_REQUIRED
        for name in gf.tensors:
            if name.endswith("attn_qkv.weight"):
                raise MinferError(f"{gf.path}: tensor '{name}': a fused q/k/v matrix is not supported for hrm_text "
                                  "(the converter writes attn_q, attn_k and attn_v)")
            if name not in known:
                raise MinferError(f"{gf.path}: tensor '{name}' is not read by the hrm_text graph (llama.cpp "
                                  f"src/models/hrm-text.cpp: {n_blocks} blocks of q/k/v/gate/o and SwiGLU matrices, "
                                  "no norm weights)")

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> HrmBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        D, F, q_out, kv_out = t.D, t.F, t.q_out, t.kv_out
        return HrmBlock(
            attn_norm=None, ffn_norm=None,
            attn_q=t.w("attn_q", (q_out, D)), attn_k=t.w("attn_k", (kv_out, D)), attn_v=t.w("attn_v", (kv_out, D)),
            attn_q_bias=t.opt("attn_q.bias", q_out), attn_k_bias=t.opt("attn_k.bias", kv_out),
            attn_v_bias=t.opt("attn_v.bias", kv_out),
            attn_gate=t.w("attn_gate", (q_out, D)), attn_output=t.w("attn_output", (D, q_out)),
            ffn_gate=t.w("ffn_gate", (F, D)), ffn_up=t.w("ffn_up", (F, D)), ffn_down=t.w("ffn_down", (D, F)))

    # ---- the forward ----

    def slot(self, h: int, l: int, j: int) -> int:
        """The cache layer of layer j in pass l of H cycle h (l = l_cycles: the H pass): hrm-text.cpp slot_base."""
        return (h * (self.l_cycles + 1) + l) * self.lps + j

    def attention(self, h: torch.Tensor, blk: HrmBlock, slot: int, cache, step: Step, ctx) -> torch.Tensor:
        """The gated attention of the normed input h (T, D) -> (T, D) in h's dtype, its keys/values in cache layer
        `slot`."""
        o = attention_heads(h, blk, self.cfg, cache, slot, step, ctx)                # (T, H*Dh)
        gate = ops.linear(h, blk.attn_gate, None, ctx)
        return ops.linear(AfmoeModel.gated(o, gate).to(h.dtype), blk.attn_output, None, ctx)

    def stack(self, x: torch.Tensor, stack: int, pass_base: int, cache, step: Step, ctx,
              last: bool = False) -> torch.Tensor:
        """One stack invocation on x (T, D) float32 -> its final norm (T, D) float32 (last: of step's rows only).
        stack 0 = L, 1 = H; pass_base: the slot of its first layer."""
        act, eps, ones = self.act_dtype, self.cfg.rms_eps, self.ones
        blocks = self.blocks[stack * self.lps:(stack + 1) * self.lps]
        h = ops.rms_norm_cast(x, ones, eps, act, ctx)
        for j, blk in enumerate(blocks):
            x, h = ops.add_rms_norm(x, self.attention(h, blk, pass_base + j, cache, step, ctx), ones, eps, act, ctx)
            f = ffn_branch(h, blk, ctx)
            if j + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, ones, eps, act, ctx)
        if last:
            x, f = step.rows(x), step.rows(f)
        return self.stack_norm(x, f, ctx)

    def stack_norm(self, x: torch.Tensor, f: torch.Tensor, ctx) -> torch.Tensor:
        """A stack's end: its last residual add x + f, then the weight-less RMSNorm, float32."""
        return ops.add_rms_norm(x, f, self.ones, self.cfg.rms_eps, torch.float32, ctx)[1]

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        zh = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        if self.embed_scale != 1.0:
            zh = zh * self.embed_scale
        zl = self.z_l_init.to(zh.dtype).expand_as(zh)
        for hc in range(self.h_cycles):
            for lc in range(self.l_cycles):
                zl = self.stack(zh + zl, 0, self.slot(hc, lc, 0), cache, step, ctx)
            last = hc + 1 == self.h_cycles
            zh = self.stack(zh + zl, 1, self.slot(hc, self.l_cycles, 0), cache, step, ctx, last=last)
        return self.head(zh.to(self.act_dtype), ctx)   # (R, V)
