"""IBM Granite SWA, dense and MoE (HF GraniteSWAForCausalLM, GraniteMoeSWAForCausalLM: granite-swash): the GGUF
arch `granite_swa` (both converters write it: llama.cpp conversion/granite.py GraniteSWAModel, GraniteMoeSWAModel).

    x_0 = E[tokens] * es
    for each layer l:
        a = W_o attn_l(r_l(W_q n(x)) * as', r_l(W_k n(x)), W_v n(x); sinks_l)       n = RMSNorm(attn_norm)
        x = x + rs * a
        x = x + rs * ffn_l(n'(x))                                                   n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm) / ls
    ffn_l: the SwiGLU of feed_forward_length (no experts), or the softmax top-k MoE (+ the shared expert)

Granite's multipliers (granite.py GraniteScales: es, as, rs, ls) around gpt-oss-style attention. Each rule and
its source (llama.cpp src/models/granite-swa.cpp: load_arch_hparams, load_arch_tensors, the graph; HF
transformers 5.25 models/granite_swa/modular_granite_swa.py, models/granitemoe_swa):
- Sinks: every layer has `blk.N.attn_sinks.weight` (H,) (flag 0: required), one learned logit per head added
  to the softmax's denominator (build_attn with attn_sinks; HF scales the output by sigmoid(lse - sink), the
  same thing: exp(lse) / (exp(lse) + exp(sink))), on the scaled scores (as, or 1/sqrt(head_dim) without the
  key: kq_scale). ops.attention's `sinks` (gpt-oss's).
- The window: `attention.sliding_window` W and `attention.sliding_window_pattern` (one flag per layer;
  load_arch_hparams get_arr / get_key without `false`: both required; the converter writes the flags from HF
  layer_types), swa_type STANDARD: a query at p sees keys p - W < j <= p on a flagged layer.
- RoPE NORM (llama_model_rope_type: LLM_ARCH_GRANITE_SWA; q/k permuted by the Llama converter), on the layers
  `attention.rope_pattern` flags (optional, default every layer: llama_hparams::has_rope; the converter writes
  it from a config's no_rope_layers; HF 5.25 marks such a layer by layer_rope_theta 0), over the whole head
  (the graph asserts n_rot == head size), the file's freq_base for every rotated layer (HF's layer_rope_theta
  may give rotated layers different bases; the converter writes none of them, so such a model is not what any
  file holds).
- FFN (build_layer_ffn): with `expert_count` 0 or absent the SwiGLU of ffn_{gate,up,down}; else
  build_moe_ffn(softmax, norm_w = true) over `expert_used_count` of `expert_count` experts of
  `feed_forward_length` rows (granite's rule: n_ff is the experts'), gate and up either fused
  (`ffn_gate_up_exps` (E, 2F, D), gate rows first: what the converter writes) or apart
  (create_tensor_gate_up_exps takes either); with `expert_shared_feed_forward_length` Fs > 0 plus a shared
  SwiGLU whose gate and up are one `ffn_up_shexp` (2 Fs, D), gate rows first (build_ffn LLM_FFN_SWIGLU:
  silu(first half) * second half; HF GraniteMoeSharedMLP input_linear.chunk(2)), added ungated.
- Refused by name: the bias tensors (granite.py check_supported; HF attention_bias / mlp_bias false as
  released), `rope.scaling.finetuned` false, deepstack inputs (Granite Vision), an integer window pattern
  (llama.cpp's loader takes only the array), `expert_weights_scale` other than 0 or 1 (the loader never reads
  it), rope_pattern / window arrays shorter than the layers, n_rot != head size.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.granite import GraniteScales, check_supported
from minfer.models.layers import Block, ffn_branch, load_block, merge_heads, rope_and_write
from minfer.models.llama import LlamaModel
from minfer.models.qwen3moe import MoeBlock, load_experts, stacked_experts
from minfer.weights import QWeight, load_qweight, load_vector


def _flags(gf, key: str, n_layers: int, default: bool | None) -> tuple[bool, ...]:
    """A per-layer bool array key (None default: required)."""
    if key not in gf.metadata:
        if default is None:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the granite_swa model)")
        return (default,) * n_layers
    v = gf.metadata[key]
    if not isinstance(v, list):
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v!r}: expected one flag per layer (an array; "
                          "llama.cpp's granite_swa loader reads only an array)")
    if len(v) < n_layers:
        raise MinferError(f"{gf.path}: metadata key '{key}' has {len(v)} entries, expected one per layer ({n_layers})")
    return tuple(bool(x) for x in v[:n_layers])


class GraniteSwaModel(GraniteScales, LlamaModel):
    """Granite's multipliers (GraniteScales.forward), per-layer window / rope / sinks in `_attention`, the dense
    or MoE FFN in `_ffn` (self.moe[i]: None for a dense model)."""

    arch = "granite_swa"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_GRANITE_SWA -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GraniteSwaModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md, n = cfg.arch, gf.metadata, cfg.n_layers
        check_supported(gf, cfg)
        key = f"{a}.attention.sliding_window"
        if key not in md:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {a} model)")
        if cfg.sliding_window <= 0:
            raise MinferError(f"{gf.path}: metadata key '{key}' is {md[key]}, expected a window > 0")
        is_local = _flags(gf, f"{a}.attention.sliding_window_pattern", n, None)
        use_rope = _flags(gf, f"{a}.attention.rope_pattern", n, True)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (granite-swa.cpp asserts n_rot == head size)")
        ws = md.get(f"{a}.expert_weights_scale")
        if ws is not None and float(ws) not in (0.0, 1.0):
            raise MinferError(f"{gf.path}: metadata key '{a}.expert_weights_scale' is {ws}, which is not supported "
                              "(0 or 1: llama.cpp's granite_swa loader does not read it)")
        E, K = cfg.n_experts, cfg.n_experts_used
        if E and not 0 < K <= E:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={K}: expected 0 < used <= count")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m._load_scales(gf, cfg)
        m.window, m.is_local, m.use_rope = cfg.sliding_window, is_local, use_rope
        m.sinks = [load_vector(gf, f"blk.{i}.attn_sinks.weight", device, cfg.n_heads) for i in range(n)]   # (H,)
        m.moe = [cls.load_moe(gf, cfg, i, device, dtype) if E else None for i in range(n)]
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """Llama's block; without the dense FFN when the model has experts (load_moe)."""
        if not cfg.n_experts:
            return load_block(gf, cfg, i, device, dtype)
        p, D, Dh = f"blk.{i}.", cfg.d_model, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape) -> QWeight:
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        return Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                     attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                     attn_output=w("attn_output", (D, q_out)), ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                     ffn_gate=None, ffn_up=None, ffn_down=None)

    @classmethod
    def load_moe(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> MoeBlock:
        """Layer i's router (E, D), experts (gate/up fused: gate_exps (E*2F, D), up_exps None) and the shared
        expert's fused gate/up in up_shexp (2 Fs, D) (gate_shexp None) with down_shexp (D, Fs)."""
        p, D, E, F, Fs = f"blk.{i}.", cfg.d_model, cfg.n_experts, cfg.ffn, cfg.expert_shared_ffn
        if p + "ffn_gate_up_exps.weight" in gf.tensors:
            gate, up = load_experts(gf, p + "ffn_gate_up_exps.weight", device, (E, 2 * F, D), dtype), None
        else:
            gate = load_experts(gf, p + "ffn_gate_exps.weight", device, (E, F, D), dtype)
            up = load_experts(gf, p + "ffn_up_exps.weight", device, (E, F, D), dtype)
        e = MoeBlock(gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D), gate_exps=gate,
                     up_exps=up, down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, F), dtype))
        if Fs > 0:
            e.up_shexp = load_qweight(gf, p + "ffn_up_shexp.weight", device, (2 * Fs, D), dtype=dtype)
            e.down_shexp = load_qweight(gf, p + "ffn_down_shexp.weight", device, (D, Fs), dtype=dtype)
        return e

    def layer_matrices(self, i: int) -> list[QWeight]:
        e = self.moe[i]
        return [] if e is None else e.matrices()

    def head_weights(self) -> list:
        return super().head_weights() + stacked_experts(self.moe)

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D): the query scaled by q_scale (GraniteScales), rope where
        use_rope[i], the window where is_local[i], the layer's sinks."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        q, k, v = q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh)
        if self.use_rope[i]:
            q = rope_and_write(cache, i, q, k, v, step, c.rope, ctx)
        else:
            cache.write(i, k, v, step)
        o = cache.attend(i, q, step, ctx, window=self.window if self.is_local[i] else 0, sinks=self.sinks[i])
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def _ffn(self, i: int, h: torch.Tensor, ctx) -> torch.Tensor:
        e = self.moe[i]
        if e is None:
            return ffn_branch(h, self.blocks[i], ctx)
        routed = ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, self.cfg.n_experts_used, True, ctx)
        if e.up_shexp is None:
            return routed
        Fs = e.down_shexp.shape[1]
        gu = ops.linear(h, e.up_shexp, None, ctx)                            # (T, 2 Fs): gate rows, then up rows
        shared = ops.linear(ops.swiglu(gu[:, :Fs].contiguous(), gu[:, Fs:].contiguous()), e.down_shexp, None, ctx)
        return routed.float() + shared.float()
