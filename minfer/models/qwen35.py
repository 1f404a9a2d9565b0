"""Qwen3.5 (dense): the GGUF arch `qwen35`, gated DeltaNet linear-attention layers mixed with gated
full-attention layers (the language model of Qwen3.5-0.8B ... 27B; the vision tower is a separate
mmproj file, not loaded: text input only).

    x_0 = E[tokens]                                       token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        linear-attention layer:  a = deltanet(h)          minfer/models/deltanet.py
        full-attention layer:    [q; gate] = W_q h        per head: Dh query dims then Dh gate dims
                                 q, k = RMSNorm per head (attn_q_norm, attn_k_norm), rope on the first
                                 n_rot dims (NEOX halves), GQA over the cache
                                 a = W_o (attn(q, k, v) * sigmoid(gate))
        x = x + a
        x = x + W_down(silu(W_gate n) * W_up n),  n = RMSNorm(x; post_attention_norm)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/qwen35.cpp; the converter conversion/qwen.py
Qwen3_5TextModel <- Qwen3NextModel; HF modeling_qwen3_5 Qwen3_5Attention / Qwen3_5DecoderLayer):
- Which layers are linear attention: `qwen35.attention.recurrent_layers` (one bool per layer, the
  converter writes it from HF layer_types), else every layer but each `full_attention_interval`-th
  (default 4: layers 3, 7, ... are full attention; qwen35.cpp load_arch_hparams,
  `(i + 1) % full_attention_interval != 0`). At least one full-attention layer is required here.
- The gated query: attn_q is (2 * H * Dh, D); per head its rows are Dh query dims then Dh gate dims
  (HF q_proj(...).view(.., H, 2 * Dh) then chunk; qwen35.cpp ggml_view_3d of Qcur_full with stride
  2 * Dh, the gate at offset Dh); the attention output times sigmoid(gate) before W_o.
- Per-head q/k RMSNorm before rope (HF q_norm / k_norm; qwen35.cpp build_norm of Qcur, Kcur). HF's
  Qwen3_5RMSNorm is x * (1 + w) with w around 0: the converter adds 1 to every `norm.weight` but
  the linear attention's own (Qwen3NextModel.modify_tensors), so the file holds 1 + w and minfer
  multiplies by it as stored.
- Rope: llama.cpp's rope type for qwen35 is IMROPE (interleaved M-RoPE, ggml_rope_multi with
  `qwen35.rope.dimension_sections`, a required key) over `rope.dimension_count` dims (HF
  partial_rotary_factor 0.25: 64 of 256). For text tokens the t/h/w positions are all the token's
  position (llama-graph.cpp llm_graph_input_pos; HF get_rope_index), so every pair llama.cpp
  rotates by one of them is plain NEOX rope (models/qwen2vl.py); the sections are checked so that
  every rotated pair takes one of t/h/w (no pair of the unused 4th section).
- Attention scale 1/sqrt(Dh) (qwen35.cpp kq_scale with no attention.scale key; HF scaling), GQA.
- The post-attention norm (`post_attention_norm`, HF post_attention_layernorm) before the SwiGLU MLP.
- key_length must equal value_length (qwen35.cpp GGML_ASSERT(n_embd_head == n_embd_head_k)).
- MTP (NextN) layers: `nextn_predict_layers` of them after the trunk (block_count counts them);
  qwen35.cpp does not run them in the main pass, neither does minfer (ModelConfig's n_layers is the
  trunk). Attention biases are refused by name (the released models have none).

The cache (runtime/kv_cache.py): full-attention layers keep K/V rows ((Hkv, Dh, Dh) per-layer
geometry); a linear-attention layer keeps no rows, only its per-sequence state (state_layers:
deltanet.py's conv ring and state ring, float32), which cannot be rewound: `recurrent = True` (the
engine reuses a cached prefix only whole; granitehybrid's rule), paged_kv = True: the batch engine
(`minfer serve -np N`) keeps that state in a pool of per-sequence slots beside its paged cache
(runtime/paged_state.py; decode rows batched by slot, deltanet.py conv_scan_batch) and shares no
prefix blocks for it. qwen35moe and qwen3next inherit both.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.deltanet import deltanet_mixer, load_deltanet, read_dims
from minfer.models.gemma4 import KVLayersConfig, with_kv_layers
from minfer.models.granitehybrid import HybridCacheConfig
from minfer.models.mamba2 import recurrent_state
from minfer.models.layers import Block, ffn_branch, head_norm, merge_heads, rope_write_attend
from minfer.models.qwen2moe import Qwen2MoeModel
from minfer.models.qwen2vl import rope_sections, text_position_pairs
from minfer.models.qwen3moe import MoeBlock, load_experts
from minfer.weights import QWeight, load_qweight, load_vector


def recurrent_layers(gf, cfg: ModelConfig) -> tuple:
    """Per layer: True for a linear-attention layer (module doc: the array, else the interval)."""
    a, md, n = cfg.arch, gf.metadata, cfg.n_layers
    key = f"{a}.attention.recurrent_layers"
    if key in md:
        raw = md[key]
        if not isinstance(raw, list) or len(raw) < n or any(not isinstance(v, (bool, int)) for v in raw):
            raise MinferError(f"{gf.path}: metadata key '{key}' = {raw!r}: expected one bool per layer ({n})")
        rec = tuple(bool(v) for v in raw[:n])
    else:
        ikey = f"{a}.full_attention_interval"
        every = md.get(ikey, 4)
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise MinferError(f"{gf.path}: metadata key '{ikey}' = {every!r}: expected a positive integer")
        rec = tuple((i + 1) % every != 0 for i in range(n))
    if all(rec):
        raise MinferError(f"{gf.path}: {a}: no full-attention layer ({key} / {a}.full_attention_interval): "
                          "minfer takes at least one")
    return rec


def check_supported(gf, cfg: ModelConfig, mrope: bool) -> None:
    a, md = cfg.arch, gf.metadata
    kl, vl = md.get(f"{a}.attention.key_length"), md.get(f"{a}.attention.value_length")
    if kl is not None and vl is not None and kl != vl:
        raise MinferError(f"{gf.path}: {a}.attention.key_length={kl} != value_length={vl} (llama.cpp asserts "
                          "equal head sizes)")
    for i in range(cfg.n_layers):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t = f"blk.{i}.{name}.bias"
            if t in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{t}': {a} files with attention biases are not supported")
    if mrope:
        secs = rope_sections(gf, a)
        pairs = text_position_pairs(secs, cfg.rope.n_rot // 2, interleaved=True)
        if secs[3] != 0 or not all(pairs):
            raise MinferError(f"{gf.path}: {a}.rope.dimension_sections={secs} leaves rotary pairs of the "
                              f"{cfg.rope.n_rot} rotated dims on the 4th (image-only) position: minfer runs text "
                              "input only")


class Qwen35Model(Qwen2MoeModel):
    """blocks[i]: the norms, the full-attention weights (None on linear-attention layers) and the dense
    FFN (None with experts); linear[i]: a linear-attention layer's weights (None on full-attention
    layers); moe[i]: the experts and gated shared expert (None when dense)."""

    arch = "qwen35"
    rope_style = "neox"       # llama_model_rope_type: QWEN35 -> IMROPE; text positions make it NEOX (doc)
    qk_norm = True
    qkv_bias = False
    paged_kv = True           # the paged cache's state slots (runtime/paged_state.py)
    recurrent = True          # the engine's prefix rule (module doc)
    mrope = True              # rope.dimension_sections required and checked
    tiled_v_heads = True      # deltanet.py: the converter's value-head reorder
    has_experts = False
    fused_ba = False          # deltanet.py: beta and alpha in one matrix (qwen3next)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """cfg with the caches' geometry: (Hkv, Dh, Dh) rows on full-attention layers, none on
        linear-attention layers, whose state_layers entry is their per-sequence state (the memory
        preflight's view, commands/preflight.py)."""
        rec, dims = recurrent_layers(gf, cfg), read_dims(gf, cfg.arch)
        kv = with_kv_layers(cfg, [None if r else (cfg.n_kv_heads, cfg.head_dim, cfg.head_dim) for r in rec])
        return HybridCacheConfig(**{f.name: getattr(kv, f.name) for f in fields(KVLayersConfig)},
                                 state_layers=tuple(dims.state_shapes() if r else None for r in rec))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Qwen35Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg, cls.mrope)
        cache_cfg = cls.cache_config(gf, cfg)
        rec, dims = recurrent_layers(gf, cfg), read_dims(gf, cfg.arch)
        if cls.has_experts:
            cls.check_experts(gf, cfg)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, linear = [], [], []
        for i in range(cfg.n_layers):
            blk, e = cls.load_layer(gf, cfg, i, rec[i], device, dtype)
            blocks.append(blk)
            moe.append(e)
            linear.append(load_deltanet(gf, i, dims, D, device, dtype, cls.fused_ba) if rec[i] else None)
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.close()
        m = cls(cache_cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe, m.linear, m.is_recurrent, m.dims = moe, linear, rec, dims
        m.weights_norm = cls.weights_norm if cfg.expert_weights_norm is None else cfg.expert_weights_norm
        return m

    @classmethod
    def check_experts(cls, gf, cfg: ModelConfig) -> None:
        """The MoE keys (qwen35moe, qwen3next)."""

    @classmethod
    def load_layer(cls, gf, cfg: ModelConfig, i: int, rec: bool, device, dtype) -> tuple:
        """blk.i's norms, full attention (full-attention layers) and FFN: (Block, MoeBlock or None)."""
        p, D, F, H, Hkv, Dh = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D), attn_q=None, attn_k=None,
                    attn_v=None, attn_output=None,
                    ffn_norm=load_vector(gf, p + "post_attention_norm.weight", device, D),
                    ffn_gate=None, ffn_up=None, ffn_down=None)
        if not rec:
            blk.attn_q, blk.attn_k = w("attn_q", (2 * H * Dh, D)), w("attn_k", (Hkv * Dh, D))
            blk.attn_v, blk.attn_output = w("attn_v", (Hkv * Dh, D)), w("attn_output", (D, H * Dh))
            blk.attn_q_norm = load_vector(gf, p + "attn_q_norm.weight", device, Dh)
            blk.attn_k_norm = load_vector(gf, p + "attn_k_norm.weight", device, Dh)
        if not cls.has_experts:
            blk.ffn_gate, blk.ffn_up, blk.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            return blk, None
        E, Fe = cfg.n_experts, cls.expert_width(cfg)
        e = MoeBlock(gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
                     gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype),
                     up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype),
                     down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype))
        cls.load_shared(gf, cfg, e, i, device, dtype)
        return blk, e

    # ---- declarations ----

    def layer_matrices(self, i: int) -> list[QWeight]:
        """A linear-attention layer's matrices before the experts (qweights, linear_groups and
        head_weights: LlamaModel's and Qwen3MoeModel's)."""
        lw = self.linear[i]
        return (lw.matrices() if lw is not None else []) + super().layer_matrices(i)

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's mixer of the normed input h (T, D) -> (T, D): linear attention or gated full attention."""
        c = self.cfg
        if self.is_recurrent[i]:
            state = recurrent_state(cache, self.arch, "linear-attention")
            return deltanet_mixer(h, self.linear[i], self.dims, state(i), step.positions, c.rms_eps,
                                  self.tiled_v_heads, ctx)
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        qg, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        qg = qg.view(T, H, 2 * Dh)
        q, gate = self.split_query(qg, Dh)
        q, k = head_norm(q, blk.attn_q_norm, c.rms_eps), head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        o = rope_write_attend(cache, i, q, k, v.view(T, Hkv, Dh), step, c.rope, ctx)
        o = merge_heads(o).float() * torch.sigmoid(gate.reshape(T, H * Dh).float())     # the output gate
        return ops.linear(o.to(h.dtype), blk.attn_output, None, ctx)

    @staticmethod
    def split_query(qg: torch.Tensor, Dh: int) -> tuple:
        """(T, H, 2 Dh) -> the query (T, H, Dh) and the gate (T, H, Dh): per head the first Dh then the next."""
        return qg[..., :Dh].contiguous(), qg[..., Dh:]

    def layer_ffn(self, h: torch.Tensor, i: int, ctx) -> torch.Tensor:
        e = self.moe[i]
        return ffn_branch(h, self.blocks[i], ctx) if e is None else self.ffn(h, e, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, blk in enumerate(self.blocks):
            x, h = ops.add_rms_norm(x, self.attention(h, blk, i, cache, step, ctx), blk.ffn_norm, eps, act, ctx)
            f = self.layer_ffn(h, i, ctx)                            # (T, D)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
