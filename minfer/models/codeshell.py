"""CodeShell (WisdomShell CodeShell-7B / CodeShell-7B-Chat; HF CodeShellForCausalLM, remote code): the GGUF arch
`codeshell`.

    x_0 = E[tokens]                                     token_embd (V, D), no position table
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = split(W_qkv h + b_qkv)                rows: D q, Hkv*Dh k, Hkv*Dh v
        x = x + W_o attn(rope(q), rope(k), v) + b_o     NEOX rope, GQA
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output (V, D), its own tensor

GPTBigCode's block with rope and grouped kv heads: starcoder2's graph on phi2's fused q/k/v (Phi2Model's attention
and loading of q/k/v), sequential. Each rule and its source (llama.cpp src/models/codeshell.cpp,
src/llama-model.cpp llama_model_rope_type; conversion/codeshell.py CodeShellModel; HF modeling_codeshell.py
CodeShellModel / CodeShellBlock / CodeShellAttention / CodeShellMLP):
- LayerNorm (mean removed) with weight AND bias, eps `codeshell.attention.layer_norm_epsilon`, before attention and
  before the MLP, sequential residuals (codeshell.cpp: build_norm(..., LLM_NORM); ffn_inp = cur + inpL; HF ln_1,
  ln_2, nn.LayerNorm(layer_norm_epsilon)); the final ln_f -> output_norm with its bias.
- q/k/v from one matrix `blk.N.attn_qkv.weight` (D + 2 Hkv Dh, D), rows q, then k, then v (HF c_attn split
  (embed_dim, kv_dim, kv_dim); the converter renames it only), with its bias `attn_qkv.bias` (HF nn.Linear's;
  create_tensor_qkv takes it as TENSOR_NOT_REQUIRED, a file without it runs without). create_tensor_qkv also takes
  separate attn_q/k/v (each bias optional), or the fused matrix with separate q/k/v biases (build_qkv adds them only
  when all three are there): phi2's loading and attention.
- GQA: `head_count_kv` from HF num_query_groups (kv head i // (H / Hkv): HF repeat_kv). Scale 1/sqrt(head_dim)
  (codeshell.cpp kq_scale; HF / math.sqrt(head_dim)). Heads span the embedding (HF raises otherwise; the loader's
  wq / wo are (D, D)), and rope turns whole heads (codeshell.cpp asserts n_embd_head == n_rot and head_k == head_v).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_CODESHELL -> NEOX; HF rotate_half), base `rope.freq_base` (the converter
  writes 10000.0, HF CodeShellRotaryEmbedding's fixed base), linear scaling factor from the file (the converter
  writes type linear, factor 1.0: ggml's freq_scale 1/factor).
- Biases on the output projection and both MLP matrices and both LayerNorms, all required (load_arch_tensors
  flag 0; HF nn.Linear / nn.LayerNorm defaults).
- The MLP is not gated: W_down gelu(W_up h + b_up) + b_down with GELU's tanh approximation (build_ffn(...,
  LLM_FFN_GELU, LLM_FFN_SEQ): ggml_gelu; HF activation_function gelu_pytorch_tanh). torch's gelu on both backends
  (llama.cpp's CPU backend looks it up in a float16 table, ~5e-4 off the exact value: tests/models/test_codeshell.py).
- The lm head is `output.weight`, required (load_arch_tensors flag 0; the converter writes HF lm_head.weight). A file
  without token_embd.weight (llama.cpp then embeds with output.weight: TENSOR_NOT_REQUIRED, TENSOR_DUPLICATED) is
  refused by ModelConfig, which reads the vocabulary from the embedding; the converter always writes it (HF wte).
- No sliding window (build_attn_inp_kv), no learned positions: HF's position_embedding_type "learned_absolute" adds
  wpe, which llama.cpp's graph never does. Any tensor llama.cpp's loader would not create (position_embd.weight,
  rope_freqs.weight, ffn_gate.weight, ...) makes llama.cpp refuse the file ("wrong number of tensors"): refused
  here by name.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import BlockTensors, refuse_per_layer_shapes, require_output
from minfer.models.phi2 import Phi2Block, Phi2Model
from minfer.models.starcoder2 import Starcoder2Model, layer_norm
from minfer.weights import load_vector

_HEAD_TENSORS = {"token_embd.weight", "output_norm.weight", "output_norm.bias", "output.weight"}
_BLOCK_TENSORS = {"attn_norm.weight", "attn_norm.bias", "attn_qkv.weight", "attn_qkv.bias", "attn_q.weight",
                  "attn_k.weight", "attn_v.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                  "attn_output.weight", "attn_output.bias", "ffn_norm.weight", "ffn_norm.bias", "ffn_up.weight",
                  "ffn_up.bias", "ffn_down.weight", "ffn_down.bias"}

_SEP_W = {"attn_q.weight", "attn_k.weight", "attn_v.weight"}
_SEP_B = {"attn_q.bias", "attn_k.bias", "attn_v.bias"}


class CodeshellModel(Phi2Model):
    arch = "codeshell"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_CODESHELL -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def check_file(cls, gf, cfg: ModelConfig) -> None:
        """MinferError for what llama.cpp's codeshell loader or graph would not run (module docstring)."""
        path, a = gf.path, cls.arch
        refuse_per_layer_shapes(gf, cfg)
        if cfg.head_dim * cfg.n_heads != cfg.d_model:
            raise MinferError(f"{path}: {a} needs head_count * head size == embedding_length (llama.cpp's q and "
                              f"output projections are (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {cfg.d_model}")
        if cfg.rope.n_rot != cfg.head_dim:       # codeshell.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise MinferError(f"{path}: {a}.rope.dimension_count {cfg.rope.n_rot} != head size {cfg.head_dim} "
                              f"(llama.cpp's {a} graph rotates whole heads only)")
        vlen = gf.metadata.get(f"{a}.attention.value_length", cfg.head_dim)
        if int(vlen) != cfg.head_dim:            # codeshell.cpp: GGML_ASSERT(n_embd_head == n_embd_head_k)
            raise MinferError(f"{path}: {a}.attention.value_length {vlen} != key length {cfg.head_dim}")
        require_output(gf, cfg, a)
        if "position_embd.weight" in gf.tensors:
            raise MinferError(f"{path}: tensor 'position_embd.weight' is not supported for {a}: learned absolute "
                              "positions (HF position_embedding_type 'learned_absolute') are not in llama.cpp's "
                              f"{a} graph, which only rotates q and k")
        for name in gf.tensors:
            parts = name.split(".", 2)
            ok = (name in _HEAD_TENSORS if parts[0] != "blk" else
                  len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < cfg.n_layers
                  and parts[2] in _BLOCK_TENSORS)
            if not ok:
                raise MinferError(f"{path}: tensor '{name}' is not supported for {a} (llama.cpp's {a} loader "
                                  "creates no such tensor and refuses the file)")
        for i in range(cfg.n_layers):
            has = {n for n in _BLOCK_TENSORS if f"blk.{i}.{n}" in gf.tensors}
            # create_tensor_qkv: the fused matrix, else the three (the fused bias then unused); with the fused
            # matrix its bias, else the three biases (the three then unused), which build_qkv adds only all together
            if "attn_qkv.weight" in has:
                bad = has & _SEP_W | (has & _SEP_B if "attn_qkv.bias" in has or len(has & _SEP_B) < 3 else set())
            else:
                bad = has & {"attn_qkv.bias"}
            if bad:
                qkv = ", ".join(sorted(has & (_SEP_W | _SEP_B | {"attn_qkv.weight", "attn_qkv.bias"})))
                raise MinferError(f"{path}: tensor 'blk.{i}.{sorted(bad)[0]}' is not supported for {a} next to "
                                  f"the layer's other q/k/v tensors ({qkv}): llama.cpp's loader would leave it "
                                  "unused or refuse the file")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "CodeshellModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_file(gf, cfg)
        # Llama's loading (each block by load_block below), not phi2's (its lm head bias) nor starcoder2's (window)
        m = super(Starcoder2Model, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                  act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, cfg.d_model)
        m.window = 0              # codeshell.cpp: build_attn_inp_kv, no window
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Phi2Block:
        blk = super().load_block(gf, cfg, i, device, dtype)     # q/k/v (fused or not), o and MLP with biases
        t = BlockTensors(gf, cfg, i, device, dtype)
        blk.ffn_norm, blk.ffn_norm_b = t.v("ffn_norm.weight", t.D), t.v("ffn_norm.bias", t.D)
        return blk

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            x = x + self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step,
                                   ctx).float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(step.rows(x), self.output_norm, self.output_norm_b, eps, act)    # (R, D)
        return self.head(h, ctx)          # (R, V)
