"""Meta Llama 4 (Scout 17B-16E, Maverick 17B-128E; HF Llama4ForCausalLM / the text model of
Llama4ForConditionalGeneration): the GGUF arch `llama4`.

    x_0 = E[tokens]                                                 token_embd (V, D); output (V, D), or tied
    for each layer l:
        h = n(x)                                                    n = RMSNorm(attn_norm)
        rope layer ((l + 1) % 4 != 0):  q, k = qn(rope(W_q h)), qn(rope(W_k h))     qn: weightless RMSNorm
                                        attention over the keys of the query's own chunk only
        NoPE layer ((l + 1) % 4 == 0):  q, k = W_q h * tau(p), W_k h                tau: temperature tuning
                                        causal attention over every key
        x = x + W_o attn(q, k, W_v h)
        h = n'(x)                                                   n' = RMSNorm(ffn_norm)
        MoE layer ((l + 1) % interleave_moe_layer_step == 0):
            e = argmax_e (W_r h)_e, s = sigmoid((W_r h)_e)          top 1 of expert_count
            x = x + E_e(s * h) + W_down_s(silu(W_gate_s h) * W_up_s h)
        other layers:  x = x + W_down(silu(W_gate h) * W_up h)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/llama4.cpp: load_arch_hparams, load_arch_tensors, the graph;
src/llama-graph.cpp build_moe_ffn and llm_graph_input_attn_temp; src/llama-hparams.h is_masked_swa;
conversion/llama.py Llama4Model; HF transformers models/llama4/modeling_llama4.py Llama4TextAttention,
Llama4TextMoe, Llama4Router, Llama4TextDecoderLayer, Llama4TextModel; configuration_llama4.py):
- RoPE NORM (adjacent pairs; llama_model_rope_type: LLM_ARCH_LLAMA4 -> NORM; the converter leaves q/k
  unpermuted, undo_permute = False; HF apply_rotary_emb on complex pairs) with Scout's llama3 factors
  (rope_freqs.weight, TENSOR_NOT_REQUIRED), on the layers with (l + 1) % 4 != 0 (hparams
  n_no_rope_layer_step = 4, not read from the file; HF no_rope_layers from no_rope_layer_interval 4).
- On the rope layers, when the model is not the 128-expert one (llama.cpp use_kq_norm = type != 17B_128E;
  HF use_qk_norm: true for Scout, false for Maverick): q and k RMS-normed per head with no weight, after
  rope (ggml_rms_norm with the model eps; HF Llama4TextL2Norm = Llama4TextWeightlessRMSNorm after
  apply_rotary_emb).
- On the NoPE layers the temperature tuning: q *= log(floor((p + 1) / 8192) + 1) * 0.1 + 1 at position p
  (llm_graph_input_attn_temp with llama4.cpp's f_attn_temp_offset 1, n_attn_temp_floor_scale 8192,
  f_attn_temp_scale 0.1, hard-coded; HF attn_temperature_tuning: log1p(floor((p + 1) / floor_scale)) *
  attn_scale + 1 with the released 8192 and 0.1). 1 below position 8191.
- Chunked attention: the layers of the swa pattern 4 (load_swa_pattern(ml, 4): l % 4 < 3, the rope layers)
  attend, from position p, only to keys j with floor(p / C) * C <= j <= p (LLAMA_SWA_TYPE_CHUNKED in
  is_masked_swa; HF create_chunked_causal_mask on the "chunked_attention" layers), C = 8192 (llama4.cpp sets
  n_swa = 8192 whatever the file says; HF attention_chunk_size 8192 as released). Not a sliding window: the
  first query of a chunk sees one key. The other layers: causal over every key. Scale 1/sqrt(head_dim).
- FFN: layer l is a MoE layer when (l + 1) % interleave_moe_layer_step == 0 (the key is required; HF
  moe_layers from interleave_moe_layer_step: Scout 1, Maverick 2), else a SwiGLU MLP of
  feed_forward_length (HF intermediate_size_mlp; the converter swaps the names). The MoE (build_moe_ffn with
  LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, norm_w false, exp_probs_b none): the choice on the router's logits
  (selection_probs = logits for LLM_ARCH_LLAMA4), the weight sigmoid(logit), applied to the experts' INPUT
  (weight_before_ffn for LLM_ARCH_LLAMA4; HF Llama4TextMoe: routed_in = h * router_scores), plus the shared
  expert of expert_feed_forward_length (n_ff_shexp = n_ff_exp; HF shared_expert of intermediate_size) on h.
  expert_weights_scale is not read by llama4.cpp (none): a file's value other than 1 is refused.
Where minfer stops: expert_used_count must be 1 (the released models; with k experts each would take its own
scaled input); a file with attention.sliding_window 0 (llama.cpp's all-full-attention MobileLLM form),
attention.sliding_window_pattern, rope.freq_base_swa other than rope.freq_base, attention.scale, a rope
dimension count other than the head size (GGML_ASSERT there) or attention biases are refused by the key.

The chunked attention: with a host-side start (prefill, eager decode) the step's queries are cut at the chunk
boundaries and each piece attends through ops.attention to the cache rows from its chunk's start (plain
causal attention within the chunk: the kernels of every other model); a CUDA-graph decode step (no host
position) takes ops.attention(chunk=): on CUDA the decode kernel's CHUNK variant (ops/cuda/attention.py; the
chunk's start computed in the kernel from the position tensor, only that chunk's keys read; counted
`attention.chunked.decode`), on the CPU the masked torch form here (chunked_attention_masked). In the batch
engine (paged_kv True: `minfer serve -np N`) the paged cache applies the same mask (runtime/paged_kv.py
attend(chunk=)): decode rows by the paged decode kernel's CHUNK variant on CUDA (each row reads only its own
chunk's tiles; counted `attention.paged_decode.chunked.triton`) or paged_attention_ref on the CPU, prefill
chunks cut at the chunk boundaries, each piece through ops.attention over its own chunk's keys
(`attention.paged_prefill.chunked.pieces`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.glm4moe import Glm4MoeBlock, load_moe_layer
from minfer.models.layers import Block, BlockTensors, ffn_branch, head_norm, load_head, merge_heads
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight


def temperature(positions: torch.Tensor, floor: int, scale: float, offset: float = 1.0) -> torch.Tensor:
    """The NoPE layers' query factor at each position (T,) float32 (llm_graph_input_attn_temp::set_input)."""
    return torch.log(torch.floor((positions.float() + offset) / floor) + 1.0) * scale + 1.0


def chunk_pieces(start: int, n: int, chunk: int) -> list[tuple[int, int, int]]:
    """The step's positions start..start+n-1 cut at the chunk boundaries: (first, end, chunk start) each."""
    out, p, end = [], start, start + n
    while p < end:
        cs = p // chunk * chunk
        b = min(end, cs + chunk)
        out.append((p, b, cs))
        p = b
    return out


def chunked_attention_masked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                             chunk: int, scale: float) -> torch.Tensor:
    """q (T, H, Dh) at positions (T,) (device) over all cache rows (S, Hkv, Dh), key j seen from p when
    p // chunk * chunk <= j <= p (is_masked_swa, LLAMA_SWA_TYPE_CHUNKED) -> (T, H, Dh); torch ops, no host value."""
    S = k_cache.shape[0]
    j = torch.arange(S, device=q.device)[None, :]
    p = positions[:, None]
    mask = (j <= p) & (j >= torch.div(p, chunk, rounding_mode="floor") * chunk)           # (T, S)
    qh = q.transpose(0, 1)
    k, v = k_cache.transpose(0, 1).to(q.dtype), v_cache.transpose(0, 1).to(q.dtype)
    out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[0] != qh.shape[0])
    return out.transpose(0, 1)


class Llama4Model(LlamaModel):
    arch = "llama4"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_LLAMA4 -> NORM
    paged_kv = True                # the paged cache's attend(chunk=) applies the chunked mask
    expert_gatings = ("sigmoid", "softmax")   # not read: llama4.cpp passes SIGMOID whatever the file says
    # llama4.cpp's constants (load_arch_hparams; hparams.n_no_rope_layer_step's default 4)
    chunk = 8192                   # n_swa of the chunked layers
    temp_floor = 8192              # n_attn_temp_floor_scale
    temp_scale = 0.1               # f_attn_temp_scale
    no_rope_step = 4               # n_no_rope_layer_step
    swa_pattern = 4                # load_swa_pattern(ml, 4): 3 chunked, 1 full

    @classmethod
    def check_supported(cls, gf, cfg: ModelConfig) -> None:
        a, md = cfg.arch, gf.metadata
        for key in ("interleave_moe_layer_step", "expert_feed_forward_length", "expert_count", "expert_used_count"):
            if f"{a}.{key}" not in md:       # llama4.cpp: get_key / get_key_or_arr without a default
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        if cfg.n_experts <= 0 or cfg.expert_ffn <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={cfg.n_experts}, expert_feed_forward_length="
                              f"{cfg.expert_ffn}: expected positive (llama4.cpp: 'model cannot have zero experts')")
        if cfg.n_experts_used != 1:
            raise MinferError(f"{gf.path}: {a}.expert_used_count={cfg.n_experts_used}: minfer runs llama4's MoE with "
                              "one expert per token (the released Scout and Maverick)")
        if cfg.expert_weights_scale != 1.0:
            raise MinferError(f"{gf.path}: {a}.expert_weights_scale={cfg.expert_weights_scale}: llama.cpp's llama4 "
                              "graph never reads it (no scale): not supported")
        if md.get(f"{a}.attention.sliding_window", None) == 0:
            raise MinferError(f"{gf.path}: metadata '{a}.attention.sliding_window' = 0 (llama.cpp's all-full-attention "
                              "form, MobileLLM): not supported")
        for key in ("attention.sliding_window_pattern", "attention.scale"):
            if f"{a}.{key}" in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is not supported for {a}")
        base_swa = md.get(f"{a}.rope.freq_base_swa", None)
        if base_swa is not None and float(base_swa) != cfg.rope.theta:
            raise MinferError(f"{gf.path}: metadata '{a}.rope.freq_base_swa' = {base_swa} differs from "
                              f"{a}.rope.freq_base = {cfg.rope.theta}: not supported")
        if cfg.rope.n_rot != cfg.head_dim:     # llama4.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot} differs from the head size "
                              f"{cfg.head_dim}: not supported")
        for name in gf.tensors:               # the released models have no attention biases (HF attention_bias)
            if name.startswith("blk.") and name.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")):
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {a} (no attention biases)")
        step = md[f"{a}.interleave_moe_layer_step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise MinferError(f"{gf.path}: metadata '{a}.interleave_moe_layer_step' = {step!r}: expected an integer >= 0")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Llama4Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_supported(gf, cfg)
        step = gf.metadata[f"{cfg.arch}.interleave_moe_layer_step"]
        is_moe = tuple(step > 0 and (i + 1) % step == 0 for i in range(cfg.n_layers))
        V, D, E, Fe = cfg.vocab, cfg.d_model, cfg.n_experts, cfg.expert_ffn
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = [cls.load_llama4_block(gf, cfg, i, is_moe[i], device, dtype) for i in range(cfg.n_layers)]
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        # the experts and the shared expert (n_ff_shexp = n_ff_exp), no selection bias
        m.moe = [load_moe_layer(gf, f"blk.{i}.", E, D, Fe, Fe, device, dtype, select_bias_optional=True)
                 if is_moe[i] else None for i in range(cfg.n_layers)]
        for i, e in enumerate(m.moe):
            if e is not None and e.exp_probs_b is not None:
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.exp_probs_b.bias' is not supported for llama4 "
                                  "(llama4.cpp passes no selection bias)")
        n = cfg.n_layers
        m.use_rope = tuple((i + 1) % cls.no_rope_step != 0 for i in range(n))
        m.is_chunked = tuple(i % cls.swa_pattern < cls.swa_pattern - 1 for i in range(n))
        m.kq_norm = E != 128             # llama4.cpp: use_kq_norm = type != LLM_TYPE_17B_128E
        m.ones = torch.ones(cfg.head_dim, dtype=torch.float32, device=device)     # the weightless norm
        return m

    @classmethod
    def load_llama4_block(cls, gf, cfg: ModelConfig, i: int, moe: bool, device, dtype) -> Block:
        """blk.i's attention and norms, and the SwiGLU MLP on a dense layer (the MoE: from_gguf)."""
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, D, F, q_out, kv_out = t.w, t.D, t.F, t.q_out, t.kv_out
        return Block(attn_norm=t.v("attn_norm.weight", D),
                     attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                     attn_output=w("attn_output", (D, q_out)),
                     ffn_norm=t.v("ffn_norm.weight", D),
                     ffn_gate=None if moe else w("ffn_gate", (F, D)), ffn_up=None if moe else w("ffn_up", (F, D)),
                     ffn_down=None if moe else w("ffn_down", (D, F)))

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        return super().qweights() + [w for e in self.moe if e is not None
                                     for w in (e.gate_exps, e.up_exps, e.down_exps, e.gate_shexp, e.up_shexp,
                                               e.down_shexp)]

    def head_weights(self) -> list:
        # the stacked experts never go through ops.linear's scratch (ops.moe_ffn decodes the rows it needs)
        return super().head_weights() + [w for e in self.moe if e is not None
                                         for w in (e.gate_exps, e.up_exps, e.down_exps)]

    # ---- the forward ----

    def attend_chunked(self, cache, layer: int, q: torch.Tensor, step: Step, ctx) -> torch.Tensor:
        """A chunked layer's attention of q (T, H, Dh) over the keys of each query's own chunk."""
        if getattr(cache, "attend_takes_chunk", False):       # the paged cache (the batch engine)
            return cache.attend(layer, q, step, ctx, chunk=self.chunk)
        kc, vc = getattr(cache, "k", None), getattr(cache, "v", None)
        if kc is None:
            raise MinferError("llama4: chunked attention needs the contiguous KV cache (runtime/kv_cache.py)")
        kc, vc = kc[layer], vc[layer]
        if step.start is None:            # a CUDA-graph step: the chunk's start from the device position
            if ops._backend(q) is not ops.reference:     # the decode kernel's CHUNK variant (attention.chunked.decode)
                return ops.attention(q, kc, vc, step.attn_start, ctx, chunk=self.chunk)
            return chunked_attention_masked(q, kc, vc, step.positions, self.chunk, 1.0 / math.sqrt(q.shape[-1]))
        outs = [ops.attention(q[a - step.start:b - step.start], kc[cs:], vc[cs:], a - cs, ctx)
                for a, b, cs in chunk_pieces(step.start, q.shape[0], self.chunk)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's heads before the o projection, merged (T, H * Dh)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k, v = q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh)
        if self.use_rope[i]:
            q, k = ops.rope(q, step.positions, c.rope), ops.rope(k, step.positions, c.rope)
            if self.kq_norm:               # after rope, no weight (ggml_rms_norm)
                q, k = head_norm(q, self.ones, c.rms_eps), head_norm(k, self.ones, c.rms_eps)
        else:
            tau = temperature(step.positions, self.temp_floor, self.temp_scale)
            q = (q.float() * tau[:, None, None]).to(q.dtype)
        cache.write(i, k, v, step)
        o = self.attend_chunked(cache, i, q, step, ctx) if self.is_chunked[i] else cache.attend(i, q, step, ctx)
        return merge_heads(o)

    def moe_ffn(self, h: torch.Tensor, e: Glm4MoeBlock, ctx) -> torch.Tensor:
        """The MoE layer's FFN of the normed input h (T, D): the chosen expert on sigmoid(its logit) * h,
        plus the shared expert on h. One expert per token, so ops.moe_ffn's "topk_softmax" weight is exactly 1
        and the choice (the largest logit) is llama.cpp's; the router's own input is h."""
        if ops._backend(h) is not ops.reference:
            ops.paths.count("moe.weight_before.torch")
        logits = h.float() @ e.gate_inp.float().t()                              # (T, E)
        s = torch.sigmoid(logits.max(-1, keepdim=True).values)                   # (T, 1)
        routed = ops.moe_ffn((h.float() * s).to(h.dtype), e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, 1, False,
                             ctx, gating="topk_softmax", router_in=h)
        return (routed.float() + self.shared_expert(h, e, ctx).float()).to(h.dtype)

    def shared_expert(self, h: torch.Tensor, e: Glm4MoeBlock, ctx) -> torch.Tensor:
        gate, up = ops.linear_many(h, (e.gate_shexp, e.up_shexp), (None, None), ctx)
        return ops.linear(ops.swiglu(gate, up, ctx), e.down_shexp, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i, blk in enumerate(blocks):
            e = self.moe[i]
            # a MoE layer's norm made whole (into_linear False): the router and ops.moe_ffn read h themselves
            x, h = ops.linear_add_rms_norm(self.attention(h, blk, i, cache, step, ctx), blk.attn_output, x,
                                           blk.ffn_norm, eps, act, ctx, into_linear=e is None, role="ffn_norm")
            f = ffn_branch(h, blk, ctx) if e is None else self.moe_ffn(h, e, ctx)     # (T, D)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
