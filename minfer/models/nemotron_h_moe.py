"""NVIDIA Nemotron-3 Nano 30B-A3B / Nemotron-3 Super (Nemotron-H MoE): the GGUF arch `nemotron_h_moe`,
nemotron_h's per-layer pattern of Mamba-2, rope-less attention and FFN blocks whose FFN blocks are a MoE of
ungated squared-ReLU experts plus an ungated squared-ReLU shared expert.

    x_0 = E[tokens]                                       token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        Mamba-2 block / attention block                    as nemotron_h (minfer/models/nemotron_h.py)
        MoE block:  x = x + L_up moe(L_down h) + W_down_s relu(W_up_s h)^2
            p   = sigmoid(W_r h)                           ffn_gate_inp (E, D): the router reads h
            top = the K largest p + b_sel                  exp_probs_b.bias (E,); within the best groups
            w   = p[top] / sum(p[top]) * s                 expert_weights_norm, expert_weights_scale
            moe(z) = sum_k w_k W_down[e_k] relu(W_up[e_k] z)^2      ffn_up_exps (E, Fe, L), ffn_down_exps (E, L, Fe)
            L_down (L, D), L_up (D, L): ffn_latent_down / ffn_latent_up when moe_latent_size is set, else
            the identity (L = D)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/nemotron-h.cpp, which builds both nemotron_h and
nemotron_h_moe: load_arch_hparams, load_arch_tensors, build_ffn_layer; the converter
conversion/nemotron.py NemotronHModel with is_moe; HF transformers models/nemotron_h/modeling_nemotron_h.py
NemotronHMoE, NemotronHTopkRouter, NemotronHExperts):
- The block kinds are nemotron_h's (head_count_kv and feed_forward_length arrays, 0 where a block is not of
  that kind: the converter writes moe_intermediate_size on the "E" blocks); a block with n_ff > 0 is a MoE
  block when expert_count > 0 (load_arch_tensors: `if (n_expert != 0)`), else nemotron_h's dense MLP.
  The released MoE patterns ("MEMEM*E...") have no "-" block; the converter reads "E" only as an FFN block.
- The router: build_moe_ffn(..., LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID) always (no expert_gating_func key is
  read; a file asking for softmax is refused by name), the choice on p + exp_probs_b (required: trunk flags 0;
  HF e_score_correction_bias), the weights read from p, renormalized when expert_weights_norm (llama.cpp's
  default false when the key is absent; HF norm_topk_prob, written by the converter), times
  expert_weights_scale (HF routed_scaling_factor; 0 or absent: 1). Group-limited choice when
  expert_group_count > 1 (HF n_group / topk_group: each group scored by its two best p + b_sel, the
  expert_group_used_count best groups eligible); llama.cpp asserts a used count > 0 there, so a grouped file
  without expert_group_used_count is refused by name. The renormalization's denominator is llama.cpp's
  (clamped to at least 2^-14; HF adds 1e-20). All of it is ops.moe_ffn's (reference.route).
- The experts: no gate, LLM_FFN_RELU_SQR: W_down relu(W_up z)^2 (HF NemotronHExperts with
  mlp_hidden_act "relu2", @use_experts_implementation(has_gate=False)); ops.moe_ffn's act "relu2" with
  gate_exps None. Width expert_feed_forward_length (llama.cpp: n_ff_exp, else n_ff(il) / n_expert_used).
- The latent (Nemotron-3 Super): with `moe_latent_size` L > 0 the experts are L wide and run on
  ffn_latent_down h; their weighted sum goes through ffn_latent_up (load_arch_tensors: moe_n_embd; the graph
  multiplies by each when present; HF fc1_latent_proj / fc2_latent_proj around the experts). The router
  and the shared expert read the full-width h. minfer requires both tensors with the key and neither without.
- The shared expert: ffn_up_shexp (Fs, D), ffn_down_shexp (D, Fs), both required (trunk flags 0), Fs =
  expert_shared_feed_forward_length (required here: llama.cpp's n_ff_shexp, 0 when absent, cannot match the
  file's tensors then), build_ffn(..., LLM_FFN_RELU_SQR, LLM_FFN_PAR): W_down_s relu(W_up_s h)^2, added to the
  routed output (HF shared_experts = NemotronHMLP of moe_shared_expert_intermediate_size).
- Refused by name: per-layer expert counts or widths (arrays: the Nemotron Puzzle form; metadata_check),
  the bias tensors nemotron_h refuses and MoE bias tensors (router, experts, shared expert, latent: HF
  mlp_bias; llama.cpp's loader has no slot for them).
- The MTP head (nextn_predict_layers, conversion/nemotron.py's folded trailing block) is not refused but never
  loaded: ModelConfig counts the trunk only, as llama.cpp's trunk graph runs n_layer() blocks.

The cache and the engine: nemotron_h's (attention blocks keep K/V rows, Mamba-2 blocks their per-sequence
state, MoE blocks nothing; served batched through the paged cache's state slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block
from minfer.models.nemotron_h import MLP, NemotronHModel, relu2
from minfer.models.qwen3moe import load_experts, stacked_experts
from minfer.weights import QWeight, load_qweight, load_vector

# bias tensors llama.cpp's nemotron_h_moe loader has no slot for (HF mlp_bias on the shared expert and the latent
# projections); a file with one is refused rather than run without it
_MOE_BIASES = ("ffn_gate_inp", "ffn_up_exps", "ffn_down_exps", "ffn_up_shexp", "ffn_down_shexp", "ffn_latent_down",
               "ffn_latent_up")


@dataclass
class NemotronMoeBlock:
    """A MoE block's router, selection bias, ungated experts, optional latent projections and shared expert."""

    gate_inp: torch.Tensor              # (E, D) float32: the router
    exp_probs_b: torch.Tensor           # (E,) float32: added to the scores for the choice only
    up_exps: QWeight                    # (E*Fe, L)
    down_exps: QWeight                  # (E*L, Fe)
    up_shexp: QWeight                   # (Fs, D)
    down_shexp: QWeight                 # (D, Fs)
    latent_down: QWeight | None = None  # (L, D)
    latent_up: QWeight | None = None    # (D, L)

    def matrices(self) -> list[QWeight]:
        return [w for w in (self.up_exps, self.down_exps, self.up_shexp, self.down_shexp, self.latent_down,
                            self.latent_up) if w is not None]


def relu2_ffn(h: torch.Tensor, up: QWeight, down: QWeight, ctx) -> torch.Tensor:
    """W_down relu(W_up h)^2 (LLM_FFN_RELU_SQR, LLM_FFN_PAR), the square in float32 (nemotron_h's MLP)."""
    if ops._backend(h) is not ops.reference:
        ops.paths.count("relu2.torch")
    u = relu2(ops.linear(h, up, None, ctx).float())
    return ops.linear(u.to(h.dtype), down, None, ctx)


class NemotronHMoeModel(NemotronHModel):
    """nemotron_h's blocks and Mamba-2 weights; moe[i]: a MoE block's weights (None elsewhere)."""

    arch = "nemotron_h_moe"
    expert_gatings = ("sigmoid",)       # the graph passes LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

    @classmethod
    def moe_dims(cls, gf, cfg: ModelConfig) -> tuple[int, int, int]:
        """(Fe, Fs, L): the experts' width, the shared expert's and the latent width (0: none; the
        experts are then D wide), each checked (module doc)."""
        md, a = gf.metadata, cfg.arch
        E, K = cfg.n_experts, cfg.n_experts_used
        for key in ("expert_used_count", "expert_shared_feed_forward_length"):
            if f"{a}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        if not 0 < K <= E:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={K}: expected 0 < used <= count")
        ff = [f for f in (cfg.ffn_per_layer or (cfg.ffn,)) if f > 0]
        Fe = cfg.expert_ffn or (ff[0] // K if ff else 0)     # load_arch_tensors: n_ff_exp, else n_ff / n_expert_used
        Fs = cfg.expert_shared_ffn
        if Fe <= 0 or Fs <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_feed_forward_length={Fe}, expert_shared_feed_forward_length="
                              f"{Fs}: expected positive widths")
        for t in gf.tensors:
            parts = t.split(".")
            if len(parts) == 4 and parts[0] == "blk" and parts[2] in _MOE_BIASES and parts[3] == "bias":
                raise MinferError(f"{gf.path}: tensor '{t}': {a} files with MoE bias tensors are not supported")
        if cfg.expert_groups > 1 and f"{a}.expert_group_used_count" not in md:
            raise MinferError(f"{gf.path}: metadata key '{a}.expert_group_used_count' is missing ({a}."
                              f"expert_group_count={cfg.expert_groups}: llama.cpp asserts a used count > 0)")
        return Fe, Fs, int(md.get(f"{a}.moe_latent_size", 0) or 0)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "NemotronHMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        moe_file = cfg.n_experts > 0
        dims = cls.moe_dims(gf, cfg) if moe_file else None
        m = super().from_gguf(gf, cfg, device, dtype, progress, act_dtype)
        m.moe = [cls.load_moe(gf, m.cfg, i, dims, device, dtype) if moe_file and k == MLP else None
                 for i, k in enumerate(m.kinds)]
        m.weights_norm = bool(cfg.expert_weights_norm)       # llama.cpp: false when the key is absent
        return m

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, kind: str, device, dtype) -> Block:
        """nemotron_h's, without the dense up/down on a MoE file's FFN blocks (load_moe's)."""
        dense = kind != MLP or cfg.n_experts == 0
        return super().load_layer(gf, cfg, i, kind if dense else "moe", device, dtype)

    @classmethod
    def load_moe(cls, gf, cfg: ModelConfig, i: int, dims, device, dtype) -> NemotronMoeBlock:
        """Block i's router, selection bias, experts, latent projections (with moe_latent_size) and shared expert."""
        p, D, E, (Fe, Fs, L) = f"blk.{i}.", cfg.d_model, cfg.n_experts, dims
        latent, L = L > 0, L or D
        for name in ("ffn_latent_down", "ffn_latent_up"):
            t = f"{p}{name}.weight"
            if latent and t not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{t}' is missing ({cfg.arch}.moe_latent_size={L})")
            if not latent and t in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{t}' without metadata key '{cfg.arch}.moe_latent_size' "
                                  "(its width)")

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        return NemotronMoeBlock(
            gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
            exp_probs_b=load_vector(gf, p + "exp_probs_b.bias", device, E),
            up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, L), dtype),
            down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, L, Fe), dtype),
            up_shexp=w("ffn_up_shexp", (Fs, D)), down_shexp=w("ffn_down_shexp", (D, Fs)),
            latent_down=w("ffn_latent_down", (L, D)) if latent else None,
            latent_up=w("ffn_latent_up", (D, L)) if latent else None)

    # ---- declarations ----

    def layer_matrices(self, i: int) -> list[QWeight]:
        e = self.moe[i]
        return super().layer_matrices(i) + (e.matrices() if e is not None else [])

    def head_weights(self) -> list:
        return super().head_weights() + stacked_experts(self.moe)

    # ---- the forward ----

    def mixer(self, h: torch.Tensor, i: int, cache, step: Step, ctx) -> torch.Tensor:
        e = self.moe[i]
        if e is None:
            return super().mixer(h, i, cache, step, ctx)
        return self.moe_ffn(h, e, ctx)

    def moe_ffn(self, h: torch.Tensor, e: NemotronMoeBlock, ctx) -> torch.Tensor:
        """A MoE block of the normed input h (T, D) -> (T, D): the routed experts (in the latent when the
        file has one) plus the shared expert (nemotron-h.cpp build_ffn_layer: ggml_add(moe_out, ffn_shexp))."""
        c = self.cfg
        z = h if e.latent_down is None else ops.linear(h, e.latent_down, None, ctx)
        routed = ops.moe_ffn(z, e.gate_inp, None, e.up_exps, e.down_exps, c.n_experts_used, self.weights_norm, ctx,
                             gating="sigmoid", act="relu2", select_bias=e.exp_probs_b, n_group=c.expert_groups,
                             topk_group=c.expert_groups_used, weights_scale=c.expert_weights_scale,
                             router_in=None if e.latent_down is None else h)
        if e.latent_up is not None:
            routed = ops.linear(routed, e.latent_up, None, ctx)
        return (routed.float() + relu2_ffn(h, e.up_shexp, e.down_shexp, ctx).float()).to(h.dtype)
