"""BitNet b1.58: the GGUF arch `bitnet` (1bitLLM/bitnet_b1_58-large / -3B, microsoft/bitnet-b1.58-2B-4T).

llama.cpp's BitnetModel converter (conversion/bitnet.py) takes BitnetForCausalLM and BitNetForCausalLM and writes
them as `bitnet`; the graph is src/models/bitnet.cpp.

    x_0 = E[tokens]                                                        token_embd (V, D), also the lm head
    for each layer l:
        a = rope(s_q W_q n(x)), rope(s_k W_k n(x)), s_v W_v n(x)            n = RMSNorm(attn_norm)
        x = x + s_o W_o RMSNorm(attn(a); attn_sub_norm)
        m = act(s_g W_gate n'(x)) * (s_u W_up n'(x))                       n' = RMSNorm(ffn_norm)
        x = x + s_d W_down RMSNorm(m; ffn_sub_norm)
    logits = E RMSNorm(x; output_norm)

Each rule and its source:
- The sub-norms: an RMSNorm of the attention's merged heads (attn_sub_norm, (D,)) before W_o, and of the gated
  MLP row (ffn_sub_norm, (F,)) before W_down (bitnet.cpp: build_norm(cur, attn_sub_norm) after build_attn, then
  build_lora_mm(wo); build_norm(cur, ffn_sub_norm) after build_ffn, then build_lora_mm(ffn_down); HF
  BitNetAttention attn_sub_norm before o_proj, BitNetMLP down_proj(ffn_sub_norm(act(gate) * up))).
- The activation: `bitnet.hidden_activation` "relu2" -> relu(g)^2 * u (LLM_FFN_RELU_SQR with LLM_FFN_PAR; HF
  ACT2FN["relu2"], the 2B-4T's hidden_act), "silu" or no key -> silu(g) * u (llama.cpp 0.3.36's graph hard-codes
  LLM_FFN_SILU; newer llama.cpp reads the key with silu as the default: ggml-org/llama.cpp src/models/bitnet.cpp
  load_arch_hparams, the fix of microsoft/BitNet#602; 1bitLLM's releases are silu). A file of the 2B-4T without the
  key runs silu, as llama.cpp runs it. Other values are refused by name.
- The weights: the converter writes each projection as round(W / s).clamp(-1, 1) * s, s = mean |W| of the tensor
  (BitnetModel.weight_quant), in any ggml type (f16, or TQ1_0 / TQ2_0 whose block scale is that s). Older files may
  hold the ternary values alone with the scale as a one-value `blk.N.<proj>.scale` tensor; llama.cpp takes each
  as TENSOR_NOT_REQUIRED and multiplies the matmul's output by it (llama-graph.cpp build_lora_mm:
  ggml_mul(ggml_mul_mat(w, cur), w_s); build_ffn for up / gate). minfer does the same, after the matmul.
- Activations stay float: llama.cpp's graph quantizes none (ggml's CPU TQ kernels round x to Q8_K blocks inside
  the dot product, an implementation detail of that backend), and transformers' BitNetForCausalLM without a
  quantization_config runs float nn.Linear. transformers' BitLinear / AutoBitLinear (the released checkpoints'
  quantization_config) round each token's activations to int8 (absmax per token) before every projection; that
  is not in the GGUF graph and minfer does not do it.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_BITNET is in the "offset by n_rot/2" list; HF rotate_half; the
  converter permutes nothing) over the whole head, head_dim = D / H; the converter writes rope.scaling linear 1.0.
- The lm head is token_embd (bitnet.cpp: build_lora_mm(model.tok_embd, cur); load_arch_tensors creates no output).
- Refused by name: an `output.weight` (llama.cpp's bitnet never reads one: it would be ignored), a q width
  H * Dh other than D (bitnet.cpp's wq / wo are (D, D)), a scale tensor of other than one value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.safe_text import safe

PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
ACTS = ("silu", "relu2")


@dataclass
class BitnetBlock(Block):
    attn_sub_norm: torch.Tensor | None = None    # (D,)
    ffn_sub_norm: torch.Tensor | None = None     # (F,)
    scales: dict | None = None                   # projection name -> (1,) float32, where the file has blk.N.<p>.scale


class BitnetModel(LlamaModel):
    """LlamaModel's loader and q/k/v group; the block adds the two sub-norms and the optional weight scales, the
    forward its own (the norms inside the branches, the file's activation)."""

    arch = "bitnet"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_BITNET -> NEOX
    ffn_act = "silu"          # the instance's, from bitnet.hidden_activation

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BitnetModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        key = f"{cls.arch}.hidden_activation"
        act = gf.metadata.get(key, "silu")
        if act not in ACTS:
            raise MinferError(f"{gf.path}: {key} '{safe(act)}' is not supported for bitnet (supported: "
                              f"{', '.join(ACTS)}; absent: silu, llama.cpp's default)")
        if cfg.n_heads * cfg.head_dim != cfg.d_model:
            raise MinferError(f"{gf.path}: bitnet's q width {cfg.n_heads} x {cfg.head_dim} differs from "
                              f"embedding_length {cfg.d_model} (llama.cpp's bitnet attn_q / attn_output are (D, D)): "
                              "not supported")
        if not cfg.tied_output:
            raise MinferError(f"{gf.path}: tensor 'output.weight' is present, but llama.cpp's bitnet takes the lm "
                              "head from token_embd and never reads it: not supported")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.ffn_act = act
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> BitnetBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        D, F, q_out, kv_out = t.D, t.F, t.q_out, t.kv_out
        blk = BitnetBlock(attn_norm=t.v("attn_norm.weight", D), attn_q=t.w("attn_q", (q_out, D)),
                          attn_k=t.w("attn_k", (kv_out, D)), attn_v=t.w("attn_v", (kv_out, D)),
                          attn_sub_norm=t.v("attn_sub_norm.weight", D), attn_output=t.w("attn_output", (D, q_out)),
                          ffn_norm=t.v("ffn_norm.weight", D), ffn_gate=t.w("ffn_gate", (F, D)),
                          ffn_up=t.w("ffn_up", (F, D)), ffn_sub_norm=t.v("ffn_sub_norm.weight", F),
                          ffn_down=t.w("ffn_down", (D, F)))
        # bitnet.cpp load_arch_tensors: `<proj>.scale` {1}, TENSOR_NOT_REQUIRED (load_vector checks the length)
        scales = {p: t.v(p + ".scale", 1) for p in PROJ if t.has(p + ".scale")}
        blk.scales = scales or None
        return blk

    # ---- the forward ----

    def scaled(self, y: torch.Tensor, blk: BitnetBlock, proj: str) -> torch.Tensor:
        """A projection's output times its `.scale` where the file has one (build_lora_mm's ggml_mul)."""
        s = blk.scales.get(proj) if blk.scales else None
        if s is None:
            return y
        if ops._backend(y) is not ops.reference:
            ops.paths.count("bitnet.scale.torch")
        return (y.float() * s).to(y.dtype)

    def attention(self, h: torch.Tensor, blk: BitnetBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> s_o W_o RMSNorm(attn(...); attn_sub_norm) (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k, v = (self.scaled(y, blk, p) for y, p in ((q, "attn_q"), (k, "attn_k"), (v, "attn_v")))
        o = merge_heads(rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh),
                                          v.reshape(T, Hkv, Dh), step, c.rope, ctx))
        o = self.sub_norm(o, blk.attn_sub_norm)
        return self.scaled(ops.linear(o, blk.attn_output, None, ctx), blk, "attn_output")

    def gated(self, g: torch.Tensor, u: torch.Tensor, ctx) -> torch.Tensor:
        """act(g) * u, (T, F) in g's dtype: silu by ops.swiglu, relu2 in float32 (HF relu(g)^2 * u)."""
        if self.ffn_act == "silu":
            return ops.swiglu(g.contiguous(), u.contiguous(), ctx)
        if ops._backend(g) is not ops.reference:
            ops.paths.count("relu2.torch")
        return (torch.relu(g.float()).square() * u.float()).to(g.dtype)

    def sub_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of a branch's inner row (attn_sub_norm / ffn_sub_norm), in x's dtype."""
        return ops.rms_norm(x, weight, self.cfg.rms_eps)

    def mlp(self, h: torch.Tensor, blk: BitnetBlock, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> s_d W_down RMSNorm(act(s_g W_gate h) * s_u W_up h; ffn_sub_norm) (T, D)."""
        g, u = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
        m = self.gated(self.scaled(g, blk, "ffn_gate"), self.scaled(u, blk, "ffn_up"), ctx)
        m = self.sub_norm(m, blk.ffn_sub_norm)
        return self.scaled(ops.linear(m, blk.ffn_down, None, ctx), blk, "ffn_down")

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32, the residual stream
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, blk in enumerate(self.blocks):
            a = self.attention(h, blk, i, cache, step, ctx)
            x, h = ops.add_rms_norm(x, a.float(), blk.ffn_norm, eps, act, ctx)
            f = self.mlp(h, blk, ctx)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f.float(), self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f.float())                  # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
