"""Kimi-Linear (moonshotai/Kimi-Linear-48B-A3B; HF KimiLinearForCausalLM): the GGUF arch `kimi-linear`. KDA
linear-attention layers mixed with MLA layers, a leading dense SwiGLU layer, then MoE layers.

    x_0 = E[tokens]                                       token_embd (V, D); output (never tied)
    for each layer l:
        h = RMSNorm(x; attn_norm)
        KDA layer (head_count_kv[l] == 0):  a = kda(h)    models/kda.py
        MLA layer:                          a = mla(h)    deepseek2.py's absorbed MLA WITHOUT rope (below)
        x = x + a
        x = x + ffn_l(RMSNorm(x; ffn_norm))               dense (l < leading_dense_block_count) or MoE
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/kimi-linear.cpp; the converter conversion/kimi_linear.py; HF
modeling_kimi_linear.py):
- Which layers are KDA: those whose `attention.head_count_kv` entry is 0 (the converter writes 0 for the KDA
  layers and 1 for the MLA ones from linear_attn_config.full_attn_layers; kimi-linear.cpp load_arch_hparams:
  is_recr = n_head_kv(i) == 0). At least one MLA layer is required here.
- MLA: deepseek2.py's absorbed form (q without q_lora: attn_q; c, k_pe = attn_kv_a_mqa h; c = RMSNorm(c;
  attn_kv_a_norm); q_abs = attn_k_b q_nope; K = [c, k_pe], V = c; o = attn_v_b o_lat), but q_pe and k_pe get NO
  rope: "Kimi MLA does NOT apply RoPE" (kimi-linear.cpp), HF KimiLinearAttention ("with NoPE, but the part of
  the keys where RoPE is applied is still shared": no rotary at all). Scale 1/sqrt(qk_nope + qk_rope)
  (kimi-linear.cpp kq_scale_mla = 1/sqrt(key_length_mla); HF scaling = qk_head_dim^-0.5).
- FFN: the first leading_dense_block_count layers a SwiGLU (ffn_{gate,up,down}); the others ops.moe_ffn with the
  file's expert_gating_func (required, as kimi-linear.cpp reads it; the release's moe_router_activation_func
  sigmoid), selection bias exp_probs_b, top expert_used_count, weights renormalized (build_moe_ffn norm_w = true;
  HF moe_renormalize) and times expert_weights_scale (HF routed_scaling_factor 2.446), plus the shared experts
  (ffn_{gate,up,down}_shexp, width expert_feed_forward_length * expert_shared_count).
- The norms take layer_norm_rms_epsilon (HF rms_norm_eps; the KDA output norm too).

The cache: an MLA layer keeps per token ONE row K = [c, k_pe] (R + Dr), its V the view of the row's first R dims
(deepseek2's latent cache, stored once: the per-layer geometry (1, R+Dr, R) of runtime/kv_cache.py kv_layers with
cache_v_in_k = R, kv_cache.layer_views); a KDA layer keeps no rows, its per-sequence state only (kda.py), which
cannot be rewound: recurrent = True (the engine reuses a cached prefix only whole). On CUDA one decode row takes
deepseek2's MLA decode kernel (attention.mla.decode.triton; the rows carry no rope, which the kernel never applies).
The batch engine: paged_kv = True (`minfer serve -np N`). The KDA layers take its state slots (kda.py kda_mixer with
a runtime/paged_state.py BatchState, as deltanet.py does); the MLA layers' paged rows are V in K as above, so the
decode rows take the paged MLA kernel (attention.paged_decode.mla.triton) on CUDA, paged_attention_ref on the CPU.
Refused by name: a file without expert_gating_func, q_lora (attn_q_a: the release has none; kimi-linear.cpp
allows it, not tested here), the older unsplit attn_kv_b, biases on the KDA convs, no MLA layer.
"""

from __future__ import annotations

import math
from dataclasses import fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.deepseek2 import Deepseek2Model, MlaBlock
from minfer.models.gemma4 import KVLayersConfig, with_kv_layers
from minfer.models.granitehybrid import HybridCacheConfig
from minfer.models.kda import kda_mixer, load_kda, read_dims
from minfer.models.layers import load_head
from minfer.models.mamba2 import recurrent_state
from minfer.models.qwen3moe import load_experts
from minfer.weights import QWeight, load_dense, load_qweight, load_vector


def kda_layers(gf, cfg: ModelConfig) -> tuple:
    """Per layer: True for a KDA layer (head_count_kv 0), checked: the MLA layers' count is 1, one at least."""
    key = f"{cfg.arch}.attention.head_count_kv"
    per = cfg.kv_heads_per_layer
    if per is None or set(per) - {0, 1} or 1 not in per:
        raise MinferError(f"{gf.path}: {key} = {list(per) if per else cfg.n_kv_heads}: expected one entry per layer, "
                          "0 on the KDA layers and 1 on the MLA layers (the converter's), with one MLA layer at least")
    return tuple(h == 0 for h in per)


class KimiLinearModel(Deepseek2Model):
    arch = "kimi-linear"
    rope_style = "normal"     # no rope is applied (module doc); ModelConfig wants a style
    paged_kv = True           # V in K on the MLA layers' paged rows, the KDA state in slots (module doc)
    recurrent = True          # the engine's prefix rule (qwen35.py's)
    value_in_key = False      # V rows kept apart (kv_layers has no V-in-K view)
    per_layer_counts = True   # head_count_kv is an array (0: a KDA layer)
    attention_free_layers = True
    expert_gatings = ("softmax", "sigmoid")

    @classmethod
    def keys(cls, gf, cfg: ModelConfig) -> dict:
        md, a = gf.metadata, cfg.arch

        def key(suffix):
            if f"{a}.{suffix}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{suffix}' is missing (needed to build the {a} model)")
            return int(md[f"{a}.{suffix}"])

        R, Dk, Dv = key("attention.kv_lora_rank"), key("attention.key_length_mla"), key("attention.value_length_mla")
        Dr = key("rope.dimension_count")
        key("expert_gating_func")
        if "blk.0.attn_kv_b.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_kv_b.weight': a {a} file from before the MLA split is "
                              "not supported; re-convert it with a current convert_hf_to_gguf.py (attn_k_b / attn_v_b)")
        if md.get(f"{a}.attention.q_lora_rank"):
            raise MinferError(f"{gf.path}: {a}.attention.q_lora_rank: a q_lora MLA (attn_q_a / attn_q_b) is not "
                              "supported for kimi-linear (the release has one q matrix)")
        if Dk <= Dr or cfg.head_dim != R + Dr:
            raise MinferError(f"{gf.path}: {a}: key_length_mla={Dk}, rope.dimension_count={Dr}, kv_lora_rank={R}, "
                              f"key_length={cfg.head_dim}: expected key_length_mla > rope dims and key_length = "
                              "kv_lora_rank + rope dims (the MLA latent cache)")
        return dict(R=R, Dk=Dk, Dv=Dv, Dr=Dr)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """(1, R+Dr, R) rows on the MLA layers, none on the KDA layers, whose state_layers entry is their state."""
        rec, k = kda_layers(gf, cfg), cls.keys(gf, cfg)
        dims = read_dims(gf, cfg.arch, cfg.n_heads)
        kv = with_kv_layers(cfg, [None if r else (1, k["R"] + k["Dr"], k["R"]) for r in rec])
        return HybridCacheConfig(**{f.name: getattr(kv, f.name) for f in fields(KVLayersConfig)
                                    if f.name != "cache_v_in_k"}, cache_v_in_k=k["R"],
                                 state_layers=tuple(dims.state_shapes() if r else None for r in rec))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "KimiLinearModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cfg.arch
        cache_cfg = cls.cache_config(gf, cfg)
        rec, k = kda_layers(gf, cfg), cls.keys(gf, cfg)
        dims = read_dims(gf, a, cfg.n_heads)
        R, Dk, Dv, Dr = k["R"], k["Dk"], k["Dv"], k["Dr"]
        H, D, V, Dn = cfg.n_heads, cfg.d_model, cfg.vocab, k["Dk"] - k["Dr"]
        n_layers, lead, E, Fe = cfg.n_layers, cfg.leading_dense_blocks, cfg.n_experts, cfg.expert_ffn
        if lead < n_layers and (E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0):
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        Fs = Fe * cfg.expert_shared_count
        bar = tqdm(total=n_layers + 2, desc=f"loading {gf.path.name}", unit="layer", disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, kda = [], []
        for i in range(n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def vec(name, n):
                return load_vector(gf, p + name, device, n)

            def dense3(name, shape):    # (H, N, K) float matrices of the torch bmm's (deepseek2.py's)
                info = gf.tensor(p + name + ".weight")
                if tuple(info.shape) != shape:
                    raise MinferError(f"{gf.path}: tensor '{p}{name}.weight' has shape {tuple(info.shape)}, "
                                      f"expected {shape}")
                return load_dense(gf, p + name + ".weight").to(device=device, dtype=act_dtype)

            b = MlaBlock(attn_norm=vec("attn_norm.weight", D), attn_kv_a_mqa=None, attn_kv_a_norm=None,
                         attn_k_b=None, attn_v_b=None, attn_output=None, ffn_norm=vec("ffn_norm.weight", D))
            if rec[i]:
                kda.append(load_kda(gf, i, dims, D, device, dtype))
            else:
                kda.append(None)
                b.attn_q, b.attn_kv_a_mqa = w("attn_q", (H * Dk, D)), w("attn_kv_a_mqa", (R + Dr, D))
                b.attn_kv_a_norm = vec("attn_kv_a_norm.weight", R)
                b.attn_k_b, b.attn_v_b = dense3("attn_k_b", (H, R, Dn)), dense3("attn_v_b", (H, Dv, R))
                b.attn_output = w("attn_output", (D, H * Dv))
            if i < lead:
                F = cfg.ffn
                b.ffn_gate, b.ffn_up, b.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            else:
                b.router = vec("ffn_gate_inp.weight", E * D).view(E, D)
                b.select_bias = vec("exp_probs_b.bias", E)
                b.gate_exps = load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype)
                b.up_exps = load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype)
                b.down_exps = load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype)
                if Fs:
                    b.gate_shexp, b.up_shexp = w("ffn_gate_shexp", (Fs, D)), w("ffn_up_shexp", (Fs, D))
                    b.down_shexp = w("ffn_down_shexp", (D, Fs))
            blocks.append(b)
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.dims, m.kda, m.kda_dims, m.is_recurrent = (H, R, Dr, Dn, Dv), kda, dims, rec
        m.kq_scale = 1.0 / math.sqrt(Dk)
        m.weights_norm = True               # kimi-linear.cpp build_moe_ffn(..., norm_w = true, ...)
        m.gating = cfg.expert_gating
        return m

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        return super().qweights() + [w for lw in self.kda if lw is not None for w in lw.matrices()]

    # ---- the forward ----

    def attention(self, h: torch.Tensor, b: MlaBlock, i: int, cache, step: Step, ctx, rope=None) -> torch.Tensor:
        """Layer i's mixer of the normed input h (T, D) -> (T, D): KDA, or MLA without rope (module doc)."""
        if self.is_recurrent[i]:
            state = recurrent_state(cache, self.arch, "KDA")
            return kda_mixer(h, self.kda[i], self.kda_dims, state(i), step.positions, self.cfg.rms_eps, ctx)
        H, R, Dr, Dn, Dv = self.dims
        T, eps, act = h.shape[0], self.cfg.rms_eps, self.act_dtype
        q = ops.linear(h, b.attn_q, None, ctx).view(T, H, Dn + Dr)
        kv = ops.linear(h, b.attn_kv_a_mqa, None, ctx)                              # (T, R + Dr)
        c = ops.rms_norm(kv[:, :R].float(), b.attn_kv_a_norm, eps).to(act)          # (T, R), norm in float32
        q_abs = torch.bmm(q[..., :Dn].transpose(0, 1).to(act), b.attn_k_b.transpose(1, 2))   # (H, T, R)
        qq = torch.cat((q_abs.transpose(0, 1), q[..., Dn:].to(act)), dim=-1)         # (T, H, R + Dr), no rope
        k = torch.cat((c.view(T, 1, R), kv[:, R:].reshape(T, 1, Dr).to(act)), dim=-1)   # (T, 1, R + Dr)
        cache.write(i, k, c.view(T, 1, R), step)
        o = cache.attend(i, qq, step, ctx, scale=self.kq_scale)                      # (T, H, R)
        o = torch.bmm(o.transpose(0, 1).to(act), b.attn_v_b.transpose(1, 2))          # (H, T, Dv)
        return ops.linear(o.transpose(0, 1).reshape(T, H * Dv), b.attn_output, None, ctx)
