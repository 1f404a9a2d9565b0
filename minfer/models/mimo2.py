"""Xiaomi MiMo-V2-Flash (HF MiMoV2FlashForCausalLM; llama.cpp LLM_ARCH_MIMO2): the GGUF arch `mimo2`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l < n_layer (= block_count - nextn_predict_layers):
        h = n(x)                                                        n = RMSNorm(attn_norm)
        q, k, v = W_q h, W_k h, W_v h                                   (H, Dk), (Hkv_l, Dk), (Hkv_l, Dv) per token
        x = x + vs * W_o attn_l(r_l(q), r_l(k), v; sinks_l)             vs = attention.value_scale
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         layers without ffn_gate_inp (dense)
        x = x + moe(h)                                                  layers with it
    logits = W_out RMSNorm(x; output_norm)                              output required (no tied head)

Each rule and its source (llama.cpp src/models/mimo2.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/mimo.py MimoV2Model; HF transformers models/mimo_v2_flash: MiMoV2FlashAttention, MiMoV2FlashMoE =
DeepseekV3MoE without shared experts, MiMoV2FlashRotaryEmbedding):
- Layer kinds: attention.sliding_window_pattern, an array (required: get_arr; 1 = sliding; HF
  hybrid_layer_pattern / layer_types), attention.sliding_window W (required): a sliding layer's query at p sees
  keys p - W < j <= p (swa_type STANDARD; HF's sliding_window). Not checked against the release: the converter
  writes config.json's sliding_window as it is, while transformers' MiMoV2FlashConfig takes sliding_window_size + 1
  when a config has that key; a release with both could give llama.cpp files a window one shorter than HF's.
- Heads: head_count H on every layer (the converter asserts swa_num_attention_heads == num_attention_heads);
  head_count_kv per layer (an array: the released SWA layers have twice the full layers' kv heads); q/k heads
  attention.key_length Dk, v heads attention.value_length Dv (HF head_dim 192 / v_head_dim 128): W_o takes
  H * Dv. No q/k norms, no biases (create_tensor_qkv finds none; refused by name), scale 1/sqrt(Dk).
- Rope: NEOX (llama_model_rope_type: LLM_ARCH_MIMO2 -> NEOX) on the first rope.dimension_count dims of each q/k
  head (HF int(head_dim * partial_rotary_factor), 64 of 192 released), the rest passed through; base
  rope.freq_base on full layers, rope.freq_base_swa (absent: freq_base) on sliding ones (get_rope_freq_base;
  HF rope_parameters per layer type), the file's linear scale on both; no rope factors.
- Sinks: blk.N.attn_sinks.weight (H,), optional per layer (TENSOR_NOT_REQUIRED; the release has them on the
  sliding layers only, HF add_swa_attention_sink_bias): one extra logit per head in the softmax's denominator
  (build_attn's sinks; HF's eager_attention_forward concatenates the sink column and drops it after).
- attention.value_scale vs (optional; absent or 1: none): the graph scales the attention's output after W_o
  (ggml_scale of build_attn's result), HF the values before it -- the same linear map.
- FFN: dense or MoE per layer by the file's router (ffn_gate_inp present: the MoE; else the dense SwiGLU of
  feed_forward_length; HF mlp_layer_types). The MoE (build_moe_ffn with the gating hard-coded SIGMOID and
  norm_w true; HF DeepseekV3TopkRouter with norm_topk_prob): p = sigmoid(W_r h), the choice on p +
  exp_probs_b.bias (optional, TENSOR_NOT_REQUIRED) within the expert_group_used_count best of
  expert_group_count groups when there are groups (llama.cpp's generic loader), weights p[top] renormalized,
  times expert_weights_scale when the file has one (the converter writes none: HF routed_scaling_factor is
  null, i.e. 1, in the release); experts of expert_feed_forward_length; no shared expert (refused by name).
- NextN / MTP blocks past n_layer are not run (the converter counts them in block_count; mimo2.cpp's trunk
  graph runs n_layer()).
The KV cache: per-layer geometry (Hkv_l, Dk, Dk): V is stored zero-padded to Dk (so every attention path --
the decode kernels, the paged cache -- sees one head size) and the output's first Dv dims are kept; the zero
columns add nothing to them.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import with_kv_layers
from minfer.models.glm4moe import Glm4MoeModel, load_moe_layer
from minfer.models.layers import Block, load_head, rope_and_write
from minfer.weights import load_qweight, load_vector


def _key(gf, arch: str, suffix: str, default=None, required: bool = False):
    name = f"{arch}.{suffix}"
    if name in gf.metadata:
        return gf.metadata[name]
    if required:
        raise MinferError(f"{gf.path}: metadata key '{name}' is missing (needed to build the {arch} model)")
    return default


class Mimo2Model(Glm4MoeModel):
    arch = "mimo2"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_MIMO2 -> NEOX
    per_layer_counts = True             # head_count_kv is an array (ModelConfig)
    expert_gatings = ("sigmoid",)       # mimo2.cpp: LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, hard-coded

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Mimo2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cfg = replace(cfg, expert_gating="sigmoid")     # mimo2.cpp hard-codes it (a file's softmax: refused below)
        a, L, D, H = cls.arch, cfg.n_layers, cfg.d_model, cfg.n_heads
        geo = cls.geometry(gf, cfg)
        Dk, Dv, kv = geo["dk"], geo["dv"], geo["kv_heads"]
        moe_layers = [f"blk.{i}.ffn_gate_inp.weight" in gf.tensors for i in range(L)]
        E, Fe = cfg.n_experts, cfg.expert_ffn
        if any(moe_layers):
            for key in ("expert_count", "expert_used_count", "expert_feed_forward_length"):
                _key(gf, a, key, required=True)
            if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
                raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                                  f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        token_embd = load_qweight(gf, "token_embd.weight", device, (cfg.vocab, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, sinks = [], [], []
        for i in range(L):
            p = f"blk.{i}."
            for t in ("attn_qkv.weight", "attn_q_norm.weight", "attn_k_norm.weight", "attn_q.bias", "attn_k.bias",
                      "attn_v.bias", "attn_output.bias", "ffn_gate_shexp.weight", "ffn_up_shexp.weight"):
                if p + t in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor '{p}{t}' is not supported for {a} (the converter writes "
                                      "separate q/k/v without norms or biases, and no shared expert)")

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            dense = not moe_layers[i]
            if not dense and p + "ffn_gate.weight" in gf.tensors:
                raise MinferError(f"{gf.path}: layer {i} has both '{p}ffn_gate_inp.weight' (MoE) and "
                                  f"'{p}ffn_gate.weight' (dense): mimo2.cpp runs one FFN per layer")
            blocks.append(Block(
                attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                attn_q=w("attn_q", (H * Dk, D)), attn_k=w("attn_k", (kv[i] * Dk, D)),
                attn_v=w("attn_v", (kv[i] * Dv, D)), attn_output=w("attn_output", (D, H * Dv)),
                ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                ffn_gate=w("ffn_gate", (cfg.ffn, D)) if dense else None,
                ffn_up=w("ffn_up", (cfg.ffn, D)) if dense else None,
                ffn_down=w("ffn_down", (D, cfg.ffn)) if dense else None))
            moe.append(None if dense else load_moe_layer(gf, p, E, D, Fe, 0, device, dtype, select_bias_optional=True))
            sinks.append(load_vector(gf, p + "attn_sinks.weight", device, H) if p + "attn_sinks.weight" in gf.tensors
                         else None)
        if "output.weight" not in gf.tensors:      # mimo2.cpp: output flag 0 (no tied head)
            raise MinferError(f"{gf.path}: tensor 'output.weight' is missing ({a} has no tied head)")
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        m = cls(cls.cache_config(gf, cfg), token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe, m.sinks, m.weights_norm = moe, sinks, True      # mimo2.cpp: norm_w = true
        for k, v in geo.items():
            setattr(m, k, v)
        return m

    @classmethod
    def geometry(cls, gf, cfg: ModelConfig) -> dict:
        """The per-layer attention layout read from the file: dk, dv, kv_heads, is_local, window, rope_local,
        v_scale."""
        a, L = cls.arch, cfg.n_layers
        if int(gf.metadata.get(f"{a}.expert_gating_func", 2)) != 2:
            raise MinferError(f"{gf.path}: {a}.expert_gating_func: mimo2.cpp's router is sigmoid only")
        window = int(_key(gf, a, "attention.sliding_window", required=True))
        pattern = _key(gf, a, "attention.sliding_window_pattern", required=True)
        if not isinstance(pattern, (list, tuple)) or len(pattern) < L:
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window_pattern={pattern!r}: expected an array of "
                              f"one flag per layer ({L}) (mimo2.cpp reads it with get_arr)")
        is_local = tuple(bool(x) for x in pattern[:L])
        if window <= 0 and any(is_local):
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window={window} with sliding-window layers")
        Dk = cfg.head_dim
        Dv = int(_key(gf, a, "attention.value_length", Dk))
        if not 0 < Dv <= Dk:
            raise MinferError(f"{gf.path}: {a}.attention.value_length={Dv}: expected 0 < value_length <= key_length "
                              f"{Dk}")
        n_rot = cfg.rope.n_rot
        if not 0 < n_rot <= Dk or n_rot % 2:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={n_rot}: expected an even count <= {Dk}")
        if cfg.rope.freq_factors is not None:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {a} (mimo2.cpp passes no "
                              "rope factors)")
        v_scale = float(_key(gf, a, "attention.value_scale", 1.0) or 1.0)   # 0 / absent: none (the graph)
        swa_base = float(_key(gf, a, "rope.freq_base_swa", cfg.rope.theta))
        kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L
        return dict(dk=Dk, dv=Dv, kv_heads=tuple(kv), is_local=is_local, window=window, v_scale=v_scale,
                    rope_local=replace(cfg.rope, theta=swa_base))

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the caches' per-layer geometry (Hkv_l, Dk, Dk): V stored at K's width (the preflight's
        config too, commands/preflight.py)."""
        g = cls.geometry(gf, cfg)
        return with_kv_layers(cfg, [(h, g["dk"], g["dk"]) for h in g["kv_heads"]])

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention of the normed input h (T, D) -> vs * W_o attn(...) (T, D)."""
        c = self.cfg
        T, H, Hkv, Dk, Dv = h.shape[0], c.n_heads, self.kv_heads[i], self.dk, self.dv
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k, v = q.view(T, H, Dk), k.view(T, Hkv, Dk), v.view(T, Hkv, Dv)
        if Dv < Dk:
            v = F.pad(v, (0, Dk - Dv))                  # the cache's V width (zeros: no effect on the first Dv)
        local = self.is_local[i]
        q = rope_and_write(cache, i, q, k, v, step, self.rope_local if local else c.rope, ctx)
        o = cache.attend(i, q, step, ctx, window=self.window if local else 0, sinks=self.sinks[i])   # (T, H, Dk)
        out = ops.linear(o[..., :Dv].reshape(T, H * Dv), blk.attn_output, None, ctx)
        return out * self.v_scale if self.v_scale != 1.0 else out
