"""IBM Granite 4.0 H (micro, tiny, small): the GGUF arch `granitehybrid`, Mamba-2 layers mixed with
GQA attention layers, each followed by a MoE with a shared expert (tiny, small) or a dense SwiGLU
(micro).

    x_0 = E[tokens] * es                                    token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        mamba layer:      a = mamba2(h)                     minfer/models/mamba2.py
        attention layer:  a = W_o attn(W_q h, W_k h, W_v h) scores (q . k) * as, no rope
        x = x + rs * a
        n = RMSNorm(x; ffn_norm)
        x = x + rs * (moe(n) + shexp(n))   or   x + rs * W_down(silu(W_gate n) * W_up n)
    logits = W_out RMSNorm(x; output_norm) / ls

Each rule and its source (llama.cpp src/models/granite-hybrid.cpp; the converter
conversion/granite.py GraniteHybridModel; HF modeling_granitemoehybrid):
- Which layers are Mamba-2: `granitehybrid.attention.head_count_kv` is an array with 0 on them
  (the converter writes 0 where HF layer_types is "mamba"; llama.cpp is_recr = n_head_kv(il) == 0).
  minfer takes one kv-head count for the attention layers (the released models) and at least one
  attention layer; others are refused by the key.
- Granite's multipliers (granite.py): the embeddings by es, the attention scores by as in place of
  1/sqrt(head_dim), every branch -- the Mamba-2 mixer's output too -- by rs before its residual add
  (granite-hybrid.cpp build_layer_ffn scales `cur` whichever the layer kind; HF
  GraniteMoeHybridDecoderLayer: residual + hidden_states * residual_multiplier), the logits by 1/ls.
  llama.cpp reads all four as optional here (load_arch_hparams: logit_scale too), an absent or zero
  one not applied.
- No rope: the converter writes `rope.scaling.finetuned` false for every hybrid that is not Bamba
  (GraniteHybridModel.set_gguf_parameters: use_rope), and llama.cpp takes that key as the rope
  switch (has_rope); HF position_embedding_type "nope" (Granite 4.0 H's config). A file with rope
  on (the key true or absent: Bamba's form) is refused by the key.
- The FFN (build_layer_ffn): with `expert_count` > 0 softmax top-k routing with renormalized weights
  over experts of `feed_forward_length` plus the ungated shared expert of
  `expert_shared_feed_forward_length` (granitemoe.py's); with no experts the dense SwiGLU
  ffn_{gate,up,down} of feed_forward_length (the converter writes HF's shared_mlp there).
- Refused by name: bias tensors on attention or the FFN (granite.py's rule), an expert_weights_scale
  other than 0 or 1.

The cache (runtime/kv_cache.py): attention layers keep their K/V rows ((Hkv, Dh, Dh) per-layer
geometry); a Mamba-2 layer keeps no rows, only its per-sequence state (state_layers: a conv ring
and an SSM state ring, float32; mamba2.py), so its memory does not grow with the context. That
state cannot be rewound: `recurrent = True` makes the engine reuse a cached prefix only when it is
the whole cached sequence (else it recomputes from position 0) and refuse a forward that starts
inside the cached tokens. paged_kv = True: the batch engine (`minfer serve -np N`) keeps the state
in a pool of per-sequence slots beside its paged cache (runtime/paged_state.py; decode rows batched
by slot, mamba2.py conv_scan_batch) and shares no prefix blocks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import KVLayersConfig, with_kv_layers
from minfer.models.granite import _scale, refuse_biases
from minfer.models.granitemoe import GraniteMoeModel
from minfer.models.layers import Block, BlockTensors, ffn_branch, merge_heads
from minfer.models.mamba2 import load_mamba2, mamba2_mixer, read_dims, recurrent_state
from minfer.models.qwen3moe import MoeBlock, load_experts
from minfer.weights import QWeight, load_qweight, load_vector


@dataclass(frozen=True)
class HybridCacheConfig(KVLayersConfig):
    """kv_layers (rows of the attention layers) and state_layers (the Mamba-2 layers' per-sequence
    state shapes, None on attention layers): runtime/kv_cache.py reads both."""

    state_layers: tuple = ()


def ssm_layers(gf, cfg: ModelConfig) -> tuple:
    """Per layer: True for a Mamba-2 layer (head_count_kv 0); the attention layers' count checked."""
    key = f"{cfg.arch}.attention.head_count_kv"
    per = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * cfg.n_layers
    counts = {h for h in per if h}
    if len(counts) != 1:
        raise MinferError(f"{gf.path}: {key} {list(per)}: minfer takes one kv-head count for the attention layers "
                          "and at least one attention layer")
    return tuple(h == 0 for h in per)


def check_supported(gf, cfg: ModelConfig) -> None:
    a, md = cfg.arch, gf.metadata
    if md.get(f"{a}.rope.scaling.finetuned", True) is not False:
        raise MinferError(f"{gf.path}: metadata key '{a}.rope.scaling.finetuned' is "
                          f"{md.get(f'{a}.rope.scaling.finetuned', 'absent (true)')}: rope on the attention layers "
                          "(Bamba's form) is not supported; Granite 4.0 H's files have it false (no rope)")
    check_biases_and_scale(gf, cfg)


def check_biases_and_scale(gf, cfg: ModelConfig) -> None:
    """Refuse bias tensors on attention or the FFN (granite.py's rule) and an expert_weights_scale other
    than 0 or 1 (granitehybrid and jamba)."""
    a, md = cfg.arch, gf.metadata
    refuse_biases(gf, cfg)
    ws = md.get(f"{a}.expert_weights_scale")
    if ws is not None and float(ws) not in (0.0, 1.0):
        raise MinferError(f"{gf.path}: metadata key '{a}.expert_weights_scale' is {ws}, which is not supported "
                          "(0 or 1)")


class GraniteHybridModel(GraniteMoeModel):
    """blocks[i]: the norms of every layer, q/k/v/o on attention layers, the dense FFN when there are
    no experts; moe[i]: the experts and shared expert (None when dense); mamba[i]: a Mamba-2
    layer's weights (None on attention layers)."""

    arch = "granitehybrid"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_GRANITE_HYBRID -> NORM (unused: no rope)
    per_layer_counts = True        # head_count_kv is an array (0: a Mamba-2 layer)
    attention_free_layers = True   # ... whose zeros ModelConfig accepts for this class
    paged_kv = True                # the paged cache's state slots (runtime/paged_state.py)
    recurrent = True               # the engine's prefix rule (module doc)
    expert_keys = ("expert_count", "expert_used_count")
    mixer_kind = "Mamba-2"         # the recurrent layers' name (recurrent_state's error)

    # ---- the recurrent mixer's hooks (jamba.py: Mamba-1 in their place) ----

    @staticmethod
    def mixer_dims(gf, cfg: ModelConfig):
        return read_dims(gf, cfg.arch, cfg.d_model)

    @staticmethod
    def load_mixer(gf, i: int, dims, D: int, device, dtype):
        return load_mamba2(gf, i, dims, D, device, dtype)

    @staticmethod
    def mixer_matrices(mb) -> list[QWeight]:
        return [mb.ssm_in, mb.ssm_out]

    def mixer(self, h: torch.Tensor, i: int, state, step: Step, ctx) -> torch.Tensor:
        return mamba2_mixer(h, self.mamba[i], self.dims, state, step.positions, self.cfg.rms_eps, ctx)

    # ---- the file's hooks ----

    @classmethod
    def check_file(cls, gf, cfg: ModelConfig) -> None:
        check_supported(gf, cfg)

    @classmethod
    def moe_layer(cls, gf, cfg: ModelConfig, i: int) -> bool:
        """Whether layer i's FFN is the experts (else the dense SwiGLU): every layer when expert_count > 0."""
        return cfg.n_experts > 0

    def load_scales(self, gf, cfg: ModelConfig) -> None:
        """Granite's multipliers (module doc) and the router's renormalization."""
        self.weights_norm = True                                                     # norm_w = true
        self.embed_scale = _scale(gf, f"{cfg.arch}.embedding_scale") or 1.0
        attn = _scale(gf, f"{cfg.arch}.attention.scale")
        self.q_scale = attn * cfg.head_dim ** 0.5 if attn else 1.0
        self.residual_scale = _scale(gf, f"{cfg.arch}.residual_scale") or 1.0
        self.logit_scale = _scale(gf, f"{cfg.arch}.logit_scale") or 1.0      # optional here (load_arch_hparams)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """cfg with the caches' geometry: (Hkv, Dh, Dh) rows on attention layers, none on recurrent
        layers, whose state_layers entry is their per-sequence state (the memory preflight's config,
        commands/preflight.py)."""
        is_ssm = ssm_layers(gf, cfg)
        dims = cls.mixer_dims(gf, cfg)
        kv = with_kv_layers(cfg, [None if s else (cfg.n_kv_heads, cfg.head_dim, cfg.head_dim) for s in is_ssm])
        return HybridCacheConfig(**{f.name: getattr(kv, f.name) for f in fields(KVLayersConfig)},
                                 state_layers=tuple(dims.state_shapes() if s else None for s in is_ssm))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GraniteHybridModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_file(gf, cfg)
        cache_cfg = cls.cache_config(gf, cfg)
        is_ssm, dims = ssm_layers(gf, cfg), cls.mixer_dims(gf, cfg)
        E = cfg.n_experts
        if E > 0:
            for key in cls.expert_keys:
                if f"{cls.arch}.{key}" not in gf.metadata:
                    raise MinferError(f"{gf.path}: metadata key '{cls.arch}.{key}' is missing "
                                      f"(needed to build the {cls.arch} model)")
            if not 0 < cfg.n_experts_used <= E:
                raise MinferError(f"{gf.path}: {cls.arch}.expert_count={E}, expert_used_count={cfg.n_experts_used}: "
                                  "expected 0 < used <= count")
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, mamba = [], [], []
        for i in range(cfg.n_layers):
            blk, e = cls.load_layer(gf, cfg, i, is_ssm[i], device, dtype)
            blocks.append(blk)
            moe.append(e)
            mamba.append(cls.load_mixer(gf, i, dims, D, device, dtype) if is_ssm[i] else None)
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.close()
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe, m.mamba, m.is_ssm, m.dims = moe, mamba, is_ssm, dims
        m.load_scales(gf, cfg)
        return m

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, ssm: bool, device, dtype) -> tuple:
        """blk.i's norms, attention (attention layers) and FFN: (Block, MoeBlock or None), the experts
        where moe_layer says (with the shared expert, load_shared), else the dense SwiGLU."""
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, p, D, F, q_out, kv_out = t.w, t.p, t.D, t.F, t.q_out, t.kv_out
        blk = Block(attn_norm=t.v("attn_norm.weight", D), attn_q=None, attn_k=None,
                    attn_v=None, attn_output=None, ffn_norm=t.v("ffn_norm.weight", D),
                    ffn_gate=None, ffn_up=None, ffn_down=None)
        if not ssm:
            blk.attn_q, blk.attn_k = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D))
            blk.attn_v, blk.attn_output = w("attn_v", (kv_out, D)), w("attn_output", (D, q_out))
        if not cls.moe_layer(gf, cfg, i):     # dense (granite-4.0-h-micro): llama.cpp's ffn_{gate,up,down} of n_ff
            blk.ffn_gate, blk.ffn_up, blk.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            return blk, None
        E = cfg.n_experts
        e = MoeBlock(gate_inp=t.v("ffn_gate_inp.weight", E * D).view(E, D),
                     gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, F, D), dtype),
                     up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, F, D), dtype),
                     down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, F), dtype))
        cls.load_shared(gf, cfg, e, i, device, dtype)
        return blk, e

    # ---- declarations ----

    def layer_matrices(self, i: int) -> list[QWeight]:
        """A recurrent layer's projections (mixer_matrices) before the experts (qweights, linear_groups
        and head_weights: LlamaModel's and Qwen3MoeModel's)."""
        mb = self.mamba[i]
        return (self.mixer_matrices(mb) if mb is not None else []) + super().layer_matrices(i)

    # ---- the forward (GraniteScales.forward: the multipliers; these give each layer's branches) ----

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's mixer of the normed input h (T, D) -> (T, D): the recurrent mixer (Mamba-2 here), or
        attention without rope (the query scaled by q_scale, so the kernels keep their 1/sqrt(head_dim))."""
        if self.is_ssm[i]:
            return self.mixer(h, i, recurrent_state(cache, self.arch, self.mixer_kind)(i), step, ctx)
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        cache.write(i, k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step)
        o = cache.attend(i, q.view(T, H, Dh), step, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def _ffn(self, i: int, h: torch.Tensor, ctx) -> torch.Tensor:
        if self.moe[i] is None:
            return ffn_branch(h, self.blocks[i], ctx)
        return super()._ffn(i, h, ctx)
