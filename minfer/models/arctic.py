"""Snowflake Arctic (snowflake-arctic-instruct / -base; HF ArcticForCausalLM, remote code): the GGUF arch `arctic`.

Every layer runs a dense residual MLP and a mixture of experts side by side, the MoE on the layer's INPUT:

    x_0 = E[tokens]                                                    token_embd (V, D); output (V, D) or tied
    for each layer l:
        r = x                                                          the layer input (llama.cpp: inpSA)
        x = r + W_o attn(rope(W_q n(r)), rope(W_k n(r)), W_v n(r))     n  = RMSNorm(attn_norm); q/k/v biases optional
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))                n' = RMSNorm(ffn_norm); W_* (D, D)
              + moe(n''(r))                                            n'' = RMSNorm(ffn_norm_exps), of r, not x
    logits = W_out RMSNorm(x; output_norm)

    moe(h): p = softmax(W_r h) (ffn_gate_inp (E, D)); the K = expert_used_count largest p; their weights divided by
            their sum (clamped at 2^-14); sum_k w_k W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)
            ffn_{gate,up}_exps (E, F, D), ffn_down_exps (E, D, F), F = feed_forward_length

Each rule and its source (llama.cpp src/models/arctic.cpp: load_arch_hparams, load_arch_tensors, the graph;
src/llama-graph.cpp build_moe_ffn; conversion/arctic.py ArcticModel; gguf-py tensor_mapping.py's ARCTIC block
mappings; HF modeling_arctic.py ArcticDecoderLayer with parallel_attn_mlp_res, the released setting):
- The graph: ffn_inp = attn_out + inpSA; ffn_out = build_ffn(build_norm(ffn_inp, ffn_norm)) + ffn_inp; the MoE's
  input is build_norm(inpSA, ffn_norm_exps) (the PRE-attention residual: HF post_attention_layernorm(residual_input));
  l_out = moe_out + ffn_out. The converter maps HF residual_layernorm -> ffn_norm and post_attention_layernorm ->
  ffn_norm_exps (tensor_mapping.py arch_block_mappings_cfg[ARCTIC]), residual_mlp.w1/w3/w2 -> ffn_gate/up/down
  (created {n_embd, n_embd}: HF ArcticMLP(is_residual_mlp=True) has width hidden_size), and stacks
  block_sparse_moe.experts.E.w1/w3/w2 into ffn_gate/up/down_exps ({n_embd, n_ff, n_expert}: the experts' width is
  feed_forward_length, HF intermediate_size; no expert_feed_forward_length is read).
- Attention: create_tensor_qkv with flag 0 (split attn_q/attn_k/attn_v required; q/k/v biases TENSOR_NOT_REQUIRED,
  added by build_qkv). A fused attn_qkv (which create_tensor_qkv would also take; the converter never writes it) is
  refused by name here, as are tensors the loader never creates (attn_output.bias, q/k norms, rope_freqs, ...): a file
  with them fails llama.cpp's tensor count. NORM rope (llama_model_rope_type: LLM_ARCH_ARCTIC -> NORM) on the rows
  the converter permuted (LlamaModel.permute, k by kv heads), i.e. HF's rotate_half. The graph asserts
  n_embd_head == n_rot (rope.dimension_count: the converter writes hidden_size // heads) and wq / wo are n_embd x
  n_embd, so H * head_dim must be the embedding length; scale 1/sqrt(head_dim).
- build_moe_ffn(..., n_expert, n_expert_used, LLM_FFN_SILU, norm_w = true, hparams.expert_weights_scale,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX): softmax gating and renormalization fixed by the graph; arctic's
  load_arch_hparams reads neither expert_weights_norm nor expert_gating_func nor expert_weights_scale (hparams keeps
  0: no scaling). The fixture's goldens measured llama.cpp ignoring each (tests/data/arch/arctic.json). A file that
  asks for something else (expert_weights_norm false, sigmoid gating, a scale other than 0 / 1) describes a model
  llama.cpp would not run as written: refused by name. HF renormalizes only when top_k > 1 (modeling_arctic.py,
  vLLM ArcticMoE renormalize = top_k > 1); with one expert llama.cpp's weight is 1 and HF's p: minfer follows
  llama.cpp. expert_group_count (generic hparam; build_moe_ffn would limit the choice to groups): the converter
  writes none for arctic; refused when > 1.
- output.weight, or token_embd when the file has none (TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_residual_norm, ffn_branch, load_head, refuse_expert_weights_scale
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel, load_experts
from minfer.weights import load_qweight, load_vector

# the tensors llama.cpp's arctic loader creates per layer (load_arch_tensors); the biases are optional
_LAYER = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight", "ffn_gate_inp.weight",
          "ffn_norm_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight")
_OPTIONAL = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
_WHY = {"attn_qkv.weight": "a fused q/k/v: the converter writes attn_q/attn_k/attn_v",
        "attn_qkv.bias": "a fused q/k/v: the converter writes attn_q/attn_k/attn_v"}


@dataclass
class ArcticMoeBlock(MoeBlock):
    """A layer's router and experts, and the norm of the layer input they read."""

    ffn_norm_exps: torch.Tensor | None = None     # (D,)


class ArcticModel(Qwen3MoeModel):
    arch = "arctic"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_ARCTIC -> NORM (the converter permutes q/k)
    qkv_bias = True           # create_tensor_qkv: q/k/v biases TENSOR_NOT_REQUIRED
    qk_norm = False
    weights_norm = True       # src/models/arctic.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...)
    expert_gatings = ("softmax",)     # the graph passes LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (a sigmoid file: refused)

    @classmethod
    def check(cls, gf, cfg: ModelConfig) -> ModelConfig:
        """The keys and tensor names checked against what llama.cpp's arctic loader and graph run; the config the
        graph runs."""
        a, md = cls.arch, gf.metadata
        for key in ("expert_count", "expert_used_count"):
            if f"{a}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model: "
                                  "every layer has experts)")
        E, K = cfg.n_experts, cfg.n_experts_used
        if E <= 0 or not 0 < K <= E:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={K}: expected 0 < used <= count")
        if cfg.ffn <= 0:
            raise MinferError(f"{gf.path}: {a}.feed_forward_length={cfg.ffn}: expected the experts' width (> 0)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot} differs from the head size "
                              f"{cfg.head_dim} (llama.cpp's arctic graph asserts n_embd_head == n_rot)")
        if cfg.n_heads * cfg.head_dim != cfg.d_model:
            raise MinferError(f"{gf.path}: {a}.attention.head_count={cfg.n_heads} x head size {cfg.head_dim} != "
                              f"embedding_length {cfg.d_model} (llama.cpp's arctic loader: attn_q and attn_output "
                              "are n_embd x n_embd)")
        if cfg.expert_weights_norm is False:
            raise MinferError(f"{gf.path}: {a}.expert_weights_norm=false is not supported (llama.cpp's arctic graph "
                              "always renormalizes the top-k weights: build_moe_ffn norm_w=true)")
        refuse_expert_weights_scale(gf, a)      # not read by arctic's loader: the graph never scales
        if cfg.expert_groups > 1:
            raise MinferError(f"{gf.path}: {a}.expert_group_count={cfg.expert_groups} is not supported (Arctic routes "
                              "over all experts; the converter writes no groups)")
        expected = {"token_embd.weight", "output_norm.weight", "output.weight"}
        for i in range(cfg.n_layers):
            expected |= {f"blk.{i}.{n}" for n in _LAYER + _OPTIONAL}
        for name in gf.tensors:
            if name not in expected:
                suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
                why = _WHY.get(suffix, "llama.cpp's arctic loader does not create it")
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {a} ({why})")
        return replace(cfg, expert_gating="softmax", expert_weights_norm=True, expert_weights_scale=1.0)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ArcticModel":
        from tqdm import tqdm

        cfg = cls.check(gf, cfg or ModelConfig.from_gguf(gf))
        V, D, Dh, E, F = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_experts, cfg.ffn
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe = [], []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def bias(name, n):       # TENSOR_NOT_REQUIRED: None when the file has none
                return load_vector(gf, p + name, device, n) if p + name in gf.tensors else None

            blocks.append(Block(
                attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                attn_output=w("attn_output", (D, q_out)),
                ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                # the residual MLP: {n_embd, n_embd} (load_arch_tensors)
                ffn_gate=w("ffn_gate", (D, D)), ffn_up=w("ffn_up", (D, D)), ffn_down=w("ffn_down", (D, D)),
                attn_q_bias=bias("attn_q.bias", q_out), attn_k_bias=bias("attn_k.bias", kv_out),
                attn_v_bias=bias("attn_v.bias", kv_out)))
            moe.append(ArcticMoeBlock(
                gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
                gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, F, D), dtype),
                up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, F, D), dtype),
                down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, F), dtype),
                ffn_norm_exps=load_vector(gf, p + "ffn_norm_exps.weight", device, D)))
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe = moe
        m.weights_norm = True
        return m

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32: the layer input r
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i, (blk, e) in enumerate(zip(blocks, self.moe)):
            hm = ops.rms_norm(x, e.ffn_norm_exps, eps).to(act)     # the MoE reads the layer input's norm
            # x + attn, and its ffn_norm (the residual MLP's input)
            x, h = attention_residual_norm(h, blk, self.cfg, cache, i, step, ctx, x, blk.ffn_norm, eps, act)
            f = (ffn_branch(h, blk, ctx).float() + self.ffn(hm, e, ctx).float()).to(act)    # (T, D)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
