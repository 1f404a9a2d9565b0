"""DeepSeek-V2 / V2-Lite / V3 / R1, Kimi-K2, Moonlight, GLM-4.7-Flash: the GGUF arch `deepseek2`.

    x_0 = E[tokens]                                                    token_embd (V, D)
    for each layer l:
        x = x + W_o mla_l(n(x))                                        n  = RMSNorm(attn_norm)
        x = x + ffn_l(n'(x))                                           n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)

Multi-head latent attention in llama.cpp's ABSORBED form (src/models/deepseek2.cpp, the is_mla
branch; HF modeling_deepseek_v2/v3.py compute the same decompressed), per token, H heads,
R = kv_lora_rank, Dr = qk_rope (rope.dimension_count), Dn = qk_nope = key_length_mla - Dr,
Dv = value_length_mla:
    q       = W_q h                                     attn_q (H*(Dn+Dr), D)          (V2-Lite)
            | W_qb RMSNorm(W_qa h; q_a_norm)            attn_q_a (Q, D), attn_q_a_norm (Q,),
                                                        attn_q_b (H*(Dn+Dr), Q)        (q_lora_rank Q)
    q_nope, q_pe = q[h, :Dn], q[h, Dn:]                 (per head)
    c, k_pe = W_kva h split at R                        attn_kv_a_mqa (R+Dr, D)
    c       = RMSNorm(c; kv_a_norm)                     attn_kv_a_norm (R,)
    q_pe, k_pe = rope(q_pe), rope(k_pe)                 NORM (adjacent pairs: HF's interleaved rope),
                                                        k_pe ONE head shared by all query heads
    q_abs[h] = Kb[h] q_nope[h]                          attn_k_b (H, R, Dn): HF kv_b_proj's k rows,
                                                        transposed by the converter (conversion/deepseek.py)
    K = [c, k_pe] (R+Dr),  V = c (R),  Q[h] = [q_abs[h], q_pe[h]]  -- MQA with ONE kv head
    o_lat[h] = softmax(kq_scale Q[h] . K) V             (R,)
    o[h]     = Vb[h] o_lat[h]                           attn_v_b (H, Dv, R) (build_attn's v_mla)
    out      = W_o [o[0] .. o[H-1]]                     attn_output (D, H*Dv)
Q[h].K = q_nope[h].(Kb[h]^T c) + q_pe[h].k_pe: HF's decompressed score (k_nope = Kb^T c), exactly.
The latent norms (attn_q_a_norm, attn_kv_a_norm) take the file's layer_norm_rms_epsilon, as llama.cpp's
build_norm(LLM_NORM_RMS) does; HF builds them with RMSNorm's default 1e-6 whatever rms_norm_eps
(modeling_deepseek_v3.py / modeling_glm4_moe_lite.py q_a_layernorm, kv_a_layernorm), so the references differ
where rms_norm_eps != 1e-6: GLM-4.7-Flash (1e-5; its fixture glm4moe-lite 3e-5 relative, all of it this eps:
tests/models/test_glm4moe_lite_solar.py). This follows llama.cpp (the file carries no second epsilon).

The cache holds what llama.cpp's MLA cache holds: per token and layer ONE row K = [c, k_pe] of
R + Dr values (DeepSeek-V2, V2-Lite, V3/R1, Kimi-K2: 512 + 64 = 576), V being its first R
dims, a view, not stored again (runtime/kv_cache.py v_in_k, set from ModelConfig.cache_v_in_k =
attention.value_length). bf16: 1152 bytes per token per layer: 30.4 KiB a token for V2-Lite's 27
layers, 68.6 KiB for V3's 61 (an uncompressed MHA cache of V3: 128 heads x (192 + 128) x 2 bytes
x 61 layers = 4.8 MiB a token). The converter writes key_length = R + Dr, value_length = R,
head_count_kv = 1, so ModelConfig's head_dim / n_kv_heads already describe this cache.

Attention scale (llama.cpp deepseek2.cpp kq_scale; HF yarn_apply_mscale): not 1/sqrt(R + Dr)
but mscale^2 / sqrt(Dn + Dr), passed to cache.attend(scale=...). With YaRN (rope.scaling.type
yarn, factor f, L = rope.scaling.yarn_log_multiplier / 0.1 = HF's mscale_all_dim, a = rope.scaling.
attn_factor):
    cos/sin of the rope part times  s = a * (1 if L != 0 else 1 + 0.1 ln f)
        (llama-context.cpp: yarn_attn_factor = get_mscale(f, m) / get_mscale(f, L) with m = L for
        deepseek2 (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX), then divided by 1 + 0.1 ln f, which ggml's
        rope_yarn multiplies back)
    mscale = s * (1 + 0.1 L ln f)
HF: cos/sin times get_mscale(f, mscale)/get_mscale(f, mscale_all_dim) and the softmax scale times
get_mscale(f, mscale_all_dim)^2: the same for V2-Lite's (0.707, 0.707) and V3's (1, 1). Where they
differ (no mscale_all_dim: HF leaves the softmax scale alone, llama.cpp multiplies it by s^2) this
follows llama.cpp. The rope frequencies: YaRN's ramp with floored/ceiled correction dims
(gpt_oss.yarn_rope(truncate=True): ggml_rope_yarn_corr_dims; HF truncate defaults True).

FFN: the first `leading_dense_block_count` layers a SwiGLU MLP (ffn_{gate,up,down}); the others
MoE (llama.cpp build_moe_ffn; the experts ffn_gate_exps / ffn_up_exps, or fused ffn_gate_up_exps as
mistral4's converter writes: create_tensor_gate_up_exps) plus shared experts, no shared gate:
    ffn(h) = moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)    ffn_{gate,up,down}_shexp, width
                                                               expert_feed_forward_length * expert_shared_count
moe: ops.moe_ffn with gating `expert_gating_func` (absent: llama.cpp's deepseek2 default, softmax
for the older V2 / V2.5 files, sigmoid for GLM-4.7-Flash's 47/48 layers with a vocabulary of
154880: load_arch_hparams), selection bias exp_probs_b (V3),
groups expert_group_count / expert_group_used_count, weights normalized when expert_weights_norm
(default false) and times expert_weights_scale (HF routed_scaling_factor). Groups are scored as
llama.cpp does, by the sum of each group's two largest selection values (V3's noaux_tc); HF's
DeepSeek-V2 (the 236B, topk_method group_limited_greedy, n_group 8 / topk_group 3) scores a group
by its largest value instead -- a difference between the two references; this follows llama.cpp.

Refused by name: files from before the MLA split (attn_kv_b, no key_length_mla: re-convert them),
llama.cpp's attention temperature tuning (attention.temperature_scale: mistral-large), a YaRN
ext_factor other than 1. NextN/MTP layers are not run (as llama.cpp's n_layer(): the first
block_count - nextn_predict_layers layers are the model).
CUDA: the projections through ops.linear, the absorption and Vb as torch bmm's on dense (H, R, Dn)
/ (H, Dv, R) matrices in the activation dtype, the attention at T = 1 by ops/cuda/attention_mla.py's
Triton kernel (attention.mla.decode.triton: one K tile serves a block of query heads, V its first R
dims), at T > 1 on the torch path of ops/cuda/attention.py (attention.mla.torch: K of R+Dr dims, V
of R), the MoE through ops.moe_ffn.
The batch engine (minfer serve -np N): paged_kv = True. Its paged cache holds the same rows (runtime/
paged_kv.py v_in_k: V the view of each slot's first R dims, stored and written once; the pool's
blocks and the preflight count K only) and takes the scale; decode rows on CUDA by the paged MLA
kernel (ops/cuda/paged_attention_mla.py, attention.paged_decode.mla.triton: rows through their
block tables, one key tile for a block of query heads, V its latent part), on the CPU by
paged_attention_ref (attention.paged_decode.mla.torch); prefill chunks by ops.attention over the
gathered rows with V their first R dims (tests/runtime/test_paged_mla.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gpt_oss import yarn_rope
from minfer.models.layers import ffn_branch, load_head
from minfer.models.llama import LlamaModel
from minfer.models.qwen3moe import load_experts
from minfer.weights import QWeight, load_dense, load_qweight, load_vector


@dataclass
class MlaBlock:
    """One layer's weights; None where this layer or file has none."""

    attn_norm: torch.Tensor            # (D,)
    attn_kv_a_mqa: QWeight             # (R + Dr, D)
    attn_kv_a_norm: torch.Tensor       # (R,)
    attn_k_b: torch.Tensor             # (H, R, Dn) dense, act dtype
    attn_v_b: torch.Tensor             # (H, Dv, R) dense, act dtype
    attn_output: QWeight               # (D, H * Dv)
    ffn_norm: torch.Tensor             # (D,)
    attn_q: QWeight | None = None      # (H * Dk, D)  no q_lora
    attn_q_a: QWeight | None = None    # (Q, D)       q_lora
    attn_q_a_norm: torch.Tensor | None = None   # (Q,)
    attn_q_b: QWeight | None = None    # (H * Dk, Q)
    ffn_gate: QWeight | None = None    # (F, D)       leading dense layers
    ffn_up: QWeight | None = None
    ffn_down: QWeight | None = None    # (D, F)
    router: torch.Tensor | None = None           # (E, D) float32   MoE layers
    select_bias: torch.Tensor | None = None      # (E,) exp_probs_b.bias (V3)
    gate_exps: QWeight | None = None   # (E * Fe, D), or the fused (E * 2Fe, D) gate_up_exps
    up_exps: QWeight | None = None     # None with the fused gate_up_exps (ops.moe_ffn: up_exps None)
    down_exps: QWeight | None = None   # (E * D, Fe)
    gate_shexp: QWeight | None = None  # (Fs, D)
    up_shexp: QWeight | None = None
    down_shexp: QWeight | None = None  # (D, Fs)

    def matrices(self) -> list[QWeight]:
        return [w for w in (self.attn_q, self.attn_q_a, self.attn_q_b, self.attn_kv_a_mqa, self.attn_output,
                            self.ffn_gate, self.ffn_up, self.ffn_down, self.gate_exps, self.up_exps, self.down_exps,
                            self.gate_shexp, self.up_shexp, self.down_shexp) if w is not None]


def mla_scales(md, arch: str, cfg: ModelConfig, yarn: bool, path) -> tuple[float, float]:
    """(c, mscale): the rope part's cos/sin factor and the scores' mscale (kq_scale = mscale^2 /
    sqrt(Dn + Dr)), llama.cpp's rules (module docstring)."""
    a = cfg.rope_attn_factor
    log_mul = float(md.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
    if not yarn:
        ln_f = math.log(1.0 / cfg.rope.freq_scale)      # linear scaling: freq_scale < 1
        return a, a * (1.0 + 0.1 * ln_f) * (1.0 + 0.1 * log_mul * ln_f)
    ext = md.get(f"{arch}.rope.scaling.yarn_ext_factor")
    if ext is not None and float(ext) != 1.0:
        raise MinferError(f"{path}: {arch}.rope.scaling.yarn_ext_factor={ext} is not supported (only 1)")
    f = float(md[f"{arch}.rope.scaling.factor"])
    ln_f = math.log(f) if f > 1 else 0.0
    c = a * (1.0 if log_mul != 0 else 1.0 + 0.1 * ln_f)
    return c, c * (1.0 + 0.1 * log_mul * ln_f)


class Deepseek2Model(LlamaModel):
    arch = "deepseek2"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_DEEPSEEK2 -> NORM
    paged_kv = True           # runtime/paged_kv.py: V in K (v_in_k), the paged MLA decode kernel on CUDA
    expert_gatings = ("softmax", "sigmoid")
    value_in_key = True       # the cache's V rows are the first value_length dims of its K rows (config.py)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Deepseek2Model":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        md, a = gf.metadata, cls.arch

        def key(suffix):
            if f"{a}.{suffix}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{suffix}' is missing (needed to build the {a} model)")
            return int(md[f"{a}.{suffix}"])

        if "blk.0.attn_kv_b.weight" in gf.tensors or f"{a}.attention.key_length_mla" not in md:
            raise MinferError(f"{gf.path}: a {a} file from before the MLA split (attn_kv_b, no "
                              f"'{a}.attention.key_length_mla'): not supported; re-convert it with a current "
                              "llama.cpp convert_hf_to_gguf.py (it writes attn_k_b / attn_v_b)")
        for k in ("attention.temperature_scale", "attention.temperature_length"):
            if f"{a}.{k}" in md:
                raise MinferError(f"{gf.path}: {a}.{k} (llama.cpp's attention temperature tuning) is not supported")
        R, Dk, Dv = key("attention.kv_lora_rank"), key("attention.key_length_mla"), key("attention.value_length_mla")
        key("attention.key_length")
        key("attention.value_length")
        key("rope.dimension_count")
        H, D, V, Dr = cfg.n_heads, cfg.d_model, cfg.vocab, cfg.rope.n_rot
        Dn, Q = Dk - Dr, int(md.get(f"{a}.attention.q_lora_rank", 0) or 0)
        if Dn < 1 or cfg.n_kv_heads != 1 or cfg.head_dim != R + Dr or cfg.cache_v_in_k != R:
            raise MinferError(f"{gf.path}: {a}: key_length_mla={Dk}, rope.dimension_count={Dr}, kv_lora_rank={R}, "
                              f"key_length={cfg.head_dim}, value_length={cfg.cache_v_in_k}, head_count_kv="
                              f"{cfg.n_kv_heads}: expected key_length_mla > rope dims, key_length = kv_lora_rank + "
                              "rope dims, value_length = kv_lora_rank and one kv head (the MLA latent cache)")
        if Q == 0 and "blk.0.attn_q_a.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: metadata key '{a}.attention.q_lora_rank' is missing (the file has attn_q_a)")
        n_layers, lead = cfg.n_layers, cfg.leading_dense_blocks   # the trunk (ModelConfig: less the NextN layers)
        E, Fe = cfg.n_experts, cfg.expert_ffn
        if lead < n_layers:
            for k in ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count"):
                key(k)
            if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
                raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                                  f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        Fs = Fe * cfg.expert_shared_count
        bar = tqdm(total=n_layers + 2, desc=f"loading {gf.path.name}", unit="layer", disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks = []
        for i in range(n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            def vec(name, n):
                return load_vector(gf, p + name, device, n)

            def dense3(name, shape):    # (H, N, K) float matrices of the torch bmm's
                info = gf.tensor(p + name + ".weight")
                if tuple(info.shape) != shape:
                    raise MinferError(f"{gf.path}: tensor '{p}{name}.weight' has shape {tuple(info.shape)}, "
                                      f"expected {shape}")
                return load_dense(gf, p + name + ".weight").to(device=device, dtype=act_dtype)

            b = MlaBlock(attn_norm=vec("attn_norm.weight", D), attn_kv_a_mqa=w("attn_kv_a_mqa", (R + Dr, D)),
                         attn_kv_a_norm=vec("attn_kv_a_norm.weight", R), attn_k_b=dense3("attn_k_b", (H, R, Dn)),
                         attn_v_b=dense3("attn_v_b", (H, Dv, R)), attn_output=w("attn_output", (D, H * Dv)),
                         ffn_norm=vec("ffn_norm.weight", D))
            if Q:
                b.attn_q_a, b.attn_q_a_norm = w("attn_q_a", (Q, D)), vec("attn_q_a_norm.weight", Q)
                b.attn_q_b = w("attn_q_b", (H * Dk, Q))
            else:
                b.attn_q = w("attn_q", (H * Dk, D))
            if i < lead:
                F = cfg.ffn
                b.ffn_gate, b.ffn_up, b.ffn_down = w("ffn_gate", (F, D)), w("ffn_up", (F, D)), w("ffn_down", (D, F))
            else:
                b.router = vec("ffn_gate_inp.weight", E * D).view(E, D)
                if p + "exp_probs_b.bias" in gf.tensors:
                    b.select_bias = vec("exp_probs_b.bias", E)
                if p + "ffn_gate_up_exps.weight" in gf.tensors:     # fused (mistral4's converter; llama.cpp
                    # create_tensor_gate_up_exps: (E, 2 Fe, D), expert e's gate rows then its up rows)
                    b.gate_exps = load_experts(gf, p + "ffn_gate_up_exps.weight", device, (E, 2 * Fe, D), dtype)
                else:
                    if p + "ffn_gate_exps.weight" not in gf.tensors:
                        raise MinferError(f"{gf.path}: tensor '{p}ffn_gate_up_exps.weight' is missing (or "
                                          f"'{p}ffn_gate_exps.weight' and '{p}ffn_up_exps.weight' apart): the "
                                          f"experts of the MoE layer {i}")
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
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.dims = (H, R, Dr, Dn, Dv)
        yarn = md.get(f"{a}.rope.scaling.type") == "yarn"
        m.rope = yarn_rope(gf, a, cfg.rope, truncate=True)[0] if yarn else cfg.rope
        m.rope_scale, mscale = mla_scales(md, a, cfg, yarn, gf.path)
        m.kq_scale = mscale * mscale / math.sqrt(Dk)
        m.weights_norm = bool(cfg.expert_weights_norm)     # llama.cpp: expert_weights_norm defaults to false
        m.gating = cfg.expert_gating
        if f"{a}.expert_gating_func" not in md:
            m.gating = "sigmoid" if n_layers in (47, 48) and V == 154880 else "softmax"
        return m

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd] + [w for b in self.blocks for w in b.matrices()]
        return ws + ([self.output] if self.output is not self.token_embd else [])

    def linear_groups(self) -> list[tuple]:
        return []

    def head_weights(self) -> list:
        return [self.token_embd, self.output] + [w for b in self.blocks for w in (b.gate_exps, b.up_exps, b.down_exps)
                                                 if w is not None]

    # ---- the forward ----

    def attention(self, h: torch.Tensor, b: MlaBlock, i: int, cache, step: Step, ctx, rope=None) -> torch.Tensor:
        """Layer i's multi-head latent attention of the normed input h (T, D) -> (T, D); rope: the
        RopeConfig of q_pe / k_pe (default self.rope; minicpm3: its LongRoPE factors per context)."""
        H, R, Dr, Dn, Dv = self.dims
        rope = rope or self.rope
        T, eps, act = h.shape[0], self.cfg.rms_eps, self.act_dtype
        if b.attn_q_a is not None:
            qa = ops.rms_norm(ops.linear(h, b.attn_q_a, None, ctx).float(), b.attn_q_a_norm, eps).to(act)
            q = ops.linear(qa, b.attn_q_b, None, ctx)
        else:
            q = ops.linear(h, b.attn_q, None, ctx)
        q = q.view(T, H, Dn + Dr)
        kv = ops.linear(h, b.attn_kv_a_mqa, None, ctx)                              # (T, R + Dr)
        c = ops.rms_norm(kv[:, :R].float(), b.attn_kv_a_norm, eps).to(act)          # (T, R), norm in float32
        q_pe = ops.rope(q[..., Dn:].contiguous(), step.positions, rope)             # (T, H, Dr)
        k_pe = ops.rope(kv[:, R:].reshape(T, 1, Dr).contiguous(), step.positions, rope)        # (T, 1, Dr)
        if self.rope_scale != 1.0:            # YaRN's cos/sin factor (llama.cpp's attn_factor)
            q_pe, k_pe = q_pe * self.rope_scale, k_pe * self.rope_scale
        q_abs = torch.bmm(q[..., :Dn].transpose(0, 1).to(act), b.attn_k_b.transpose(1, 2))   # (H, T, R)
        qq = torch.cat((q_abs.transpose(0, 1), q_pe.to(act)), dim=-1)                # (T, H, R + Dr)
        k = torch.cat((c.view(T, 1, R), k_pe.to(act)), dim=-1)                       # (T, 1, R + Dr)
        cache.write(i, k, c.view(T, 1, R), step)
        o = cache.attend(i, qq, step, ctx, scale=self.kq_scale)                      # (T, H, R)
        o = torch.bmm(o.transpose(0, 1).to(act), b.attn_v_b.transpose(1, 2))          # (H, T, Dv)
        return ops.linear(o.transpose(0, 1).reshape(T, H * Dv), b.attn_output, None, ctx)

    def ffn(self, h: torch.Tensor, b: MlaBlock, ctx) -> torch.Tensor:
        """Layer's FFN of the normed input h (T, D) -> (T, D): dense, or routed + shared experts."""
        if b.router is None:
            return ffn_branch(h, b, ctx)
        c = self.cfg
        out = ops.moe_ffn(h, b.router, b.gate_exps, b.up_exps, b.down_exps, c.n_experts_used, self.weights_norm, ctx,
                          gating=self.gating, select_bias=b.select_bias, n_group=c.expert_groups,
                          topk_group=c.expert_groups_used, weights_scale=c.expert_weights_scale)
        if b.gate_shexp is not None:
            s = ops.linear(ops.swiglu(ops.linear(h, b.gate_shexp, None, ctx), ops.linear(h, b.up_shexp, None, ctx)),
                           b.down_shexp, None, ctx)
            out = (out.float() + s.float()).to(h.dtype)
        return out

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                         # (T, D) float32
        for i, b in enumerate(self.blocks):
            h = ops.rms_norm(x, b.attn_norm, eps).to(act)
            x, h = ops.add_rms_norm(x, self.attention(h, b, i, cache, step, ctx).float(), b.ffn_norm, eps, act, ctx)
            x = x + self.ffn(h, b, ctx).float()
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)      # (R, D)
        return self.head(h, ctx)          # (R, V)
