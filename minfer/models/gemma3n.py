"""Google Gemma 3n (text): the GGUF arch `gemma3n` (E2B, E4B): gemma4's E2B/E4B layers (models/gemma4.py:
per-head q/k norms, weightless v norm, attention scale 1, per-layer embeddings, shared-KV layers) around
AltUp's parallel streams and a LAuReL branch, with activation sparsity on the first layers' MLPs.

    x_0 = E[tokens] * sqrt(D)                                   token_embd (V, D), tied lm head
    ple = per-layer inputs of (tokens, x_0)                     (T, L, P), gemma4.py's _per_layer_inputs
    X   = [x_0, s(A_1 x_0), ..., s(A_{n-1} x_0)]                n AltUp streams; A_k = altup_proj[k-1] (D, D);
                                                                s(y) = y * rms(x_0) / rms(y)
    for each layer l (window_l, rope_l by the layer's kind; shared-KV layers read an earlier layer's cache):
        P  = X + R(m(X_0)) X          predict: m(z) = tanh(W_router RMSNorm(z; router_norm) / D)  (n,)
                                      R = reshape(W_pred m, n, n): P_b = X_b + sum_a R[b, a] X_a
        a  = P_0;  h = RMSNorm(a; attn_norm)
        lr = h + RMSNorm(W_lr W_ll h; laurel_post_norm)                                 LAuReL
        y  = (a + RMSNorm(attn_l(h); post_attention_norm) + lr) / sqrt(2)
        g  = W_gate RMSNorm(y; ffn_norm)   [layers with sparsity: g = relu(g - (mean(g) + std(g) * c_l))]
        o  = y + RMSNorm(W_down(gelu_tanh(g) * W_up RMSNorm(y; ffn_norm)); post_ffw_norm)
        X  = P + (W_corr m(o) + 1) (o - P_0)                 correct: stream k scaled by coefficient k
        X_k += RMSNorm(W_proj(gelu_tanh(W_inp_gate (X_0 * correct_scale)) * ple[l]); post_norm)   k >= 1
    z = (X_0 + sum_{k>=1} s'(U_k X_k)) / n                     U_k = altup_unembd_proj[k-1]; s' to rms(X_0)
    logits = cap * tanh(W_out RMSNorm(z; output_norm) / cap)    cap = final_logit_softcapping

Sources: llama.cpp src/models/gemma3n.cpp (load_arch_hparams, load_arch_tensors, the graph and its
altup_predict / altup_correct / laurel / gaussian_topk / calc_magnitude), src/llama-model.cpp (the KV
reuse callback), and the converter conversion/gemma.py Gemma3NModel; HF transformers
models/gemma3n/modeling_gemma3n.py (Gemma3nTextModel, Gemma3nTextDecoderLayer, Gemma3nTextAltUp,
Gemma3nTextLaurelBlock, Gemma3nTextMLP, Gemma3nTextAttention) and configuration_gemma3n.py. Facts:
- Norm weights are stored as they are (Gemma3NModel.norm_shift = 0; HF Gemma3nRMSNorm is x * w).
- Layer kinds from the per-layer bool array `attention.sliding_window_pattern` (the converter writes
  layer_types); window layers: base `rope.freq_base_swa`, global: `rope.freq_base`; NEOX rope over the
  whole head (`attention.key_length` = value_length, one head size for all layers); scale 1.0.
- AltUp: `altup.num_inputs` streams (llama.cpp and the converter: 4), `altup.active_idx` (llama.cpp: 0,
  never read; HF adds the per-layer branch to streams 1.. and takes the unembedding's target magnitude
  from stream 0 whatever the index, so a file with another index is refused by the key). The coefficient
  matrices act per token (predict: n x n, correct: n), the modalities from the active stream (predict)
  and from the layer's output (correct), both through the same router and router norm.
- The stream magnitudes: HF sqrt(mean(y^2)) with mean(y^2) clamped at 1e-5 for the new stream;
  llama.cpp sqrt(sum(y^2)) (the same ratio): minfer takes HF's clamp.
- Activation sparsity: `activation_sparsity_scale` holds c_l = icdf_N(0,1)(p_l) per layer (the
  converter; -inf where p_l = 0: no sparsity, HF `activation_sparsity > 0`). HF's std is the biased one
  (torch.std(unbiased=False), JAX's jnp.std); llama.cpp's gaussian_topk divides by n - 1 and hard-codes
  c = icdf(0.95) on the first 10 layers (the released files' values): minfer reads the key and uses
  HF's std (tests/models/test_gemma3n.py shows the n - 1 form misses transformers).
- Shared KV: `attention.shared_kv_layers` = S (llama.cpp hard-codes n_layer_kv_from_start = 20, the
  released E2B 30 - 10 and E4B 35 - 15; HF reads num_kv_shared_layers): gemma4.py's reuse rule and check.
- Per-layer embeddings: gemma4.py's (the same tensors and formula); the per-layer branch gates the
  corrected active stream times `altup_correct_scale` (llama.cpp always; HF when config.altup_correct_scale,
  True in every release) and is added to streams 1.. (not to the active one).
- LAuReL: `blk.N.laurel_l` (r, D), `laurel_r` (D, r), `laurel_post_norm`; the rank is the tensors'
  (llama.cpp assumes 64, HF laurel_rank).
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import Gemma4Model, _key
from minfer.models.layers import Block
from minfer.weights import load_dense, load_qweight, load_vector

MAGNITUDE_FLOOR = 1e-5    # HF Gemma3nTextModel.forward: new_magnitude = sqrt(mean(y^2).clamp(min=1e-5))


def _rms(y: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """sqrt(mean(y^2)) over the last dim, (..., 1), floored at sqrt(floor)."""
    ms = y.pow(2).mean(-1, keepdim=True)
    return (ms.clamp(min=floor) if floor else ms).sqrt()


def gaussian_topk(g: torch.Tensor, c: float) -> torch.Tensor:
    """relu(g - (mean(g) + std(g) * c)) over the last dim, std the biased one (HF Gemma3nTextMLP._gaussian_topk:
    torch.std(unbiased=False); llama.cpp's gaussian_topk divides by n - 1 instead)."""
    g32 = g.float()
    mean = g32.mean(-1, keepdim=True)
    std = (g32 - mean).pow(2).mean(-1, keepdim=True).sqrt()
    return torch.relu(g32 - (mean + std * c)).to(g.dtype)


class Gemma3nModel(Gemma4Model):
    arch = "gemma3n"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA3N -> NEOX
    qk_norm = True
    per_layer_counts = True   # the converter writes feed_forward_length as an array (HF intermediate_size per layer)

    @classmethod
    def layer_geometry(cls, gf, cfg: ModelConfig) -> dict:
        """Layer kinds, one head size, per-layer kv heads and ropes, the KV sources (gemma4.py's dict)."""
        arch, L = cfg.arch, cfg.n_layers
        is_local, window = cls.local_layers(gf, cfg)
        dh = cfg.head_dim
        if cfg.rope.n_rot != dh:
            raise MinferError(f"{gf.path}: {arch}.rope.dimension_count={cfg.rope.n_rot}: expected the head size {dh} "
                              "(gemma3n rotates every dim)")
        kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L
        return dict(is_local=is_local, window=window, head_dims=(dh,) * L, kv_heads=tuple(kv),
                    layer_rope=[cfg.rope_swa if loc else cfg.rope for loc in is_local],
                    kv_source=cls.shared_kv_sources(gf, arch, is_local))

    @classmethod
    def check_supported(cls, gf, cfg: ModelConfig) -> None:
        if any(n.endswith("attn_qkv.weight") for n in gf.tensors):
            raise MinferError(f"{gf.path}: tensor 'blk.N.attn_qkv.weight' (fused q/k/v) is not supported for gemma3n")
        dv = int(gf.metadata.get("gemma3n.attention.value_length", cfg.head_dim))
        if dv != cfg.head_dim:
            raise MinferError(f"{gf.path}: gemma3n.attention.value_length={dv} differs from the key length "
                              f"{cfg.head_dim} (HF and llama.cpp use one head_dim)")

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        # HF Gemma3nTextAttention always has v_proj (no k-as-v form); llama.cpp's create_tensor_qkv requires it
        if cls._loading_geometry["kv_source"][i] == i and f"blk.{i}.attn_v.weight" not in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.{i}.attn_v.weight' is missing")
        return super().load_block(gf, cfg, i, device, dtype)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Gemma3nModel":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        c, D, L = m.cfg, m.cfg.d_model, m.cfg.n_layers
        if not m.ple_dim:
            raise MinferError(f"{gf.path}: metadata key 'gemma3n.embedding_length_per_layer_input' is missing "
                              "(gemma3n's per-layer embeddings)")
        n = int(_key(gf, c.arch, "altup.num_inputs"))
        if n < 2:
            raise MinferError(f"{gf.path}: gemma3n.altup.num_inputs={n}: expected at least 2 streams")
        act_idx = int(_key(gf, c.arch, "altup.active_idx"))
        if act_idx != 0:
            raise MinferError(f"{gf.path}: gemma3n.altup.active_idx={act_idx}: only 0 is supported (llama.cpp "
                              "hard-codes it; HF's per-layer branch and unembedding assume stream 0)")
        scales = _key(gf, c.arch, "activation_sparsity_scale")
        if not isinstance(scales, list) or len(scales) != L:
            raise MinferError(f"{gf.path}: gemma3n.activation_sparsity_scale: expected one value per layer ({L})")
        # -inf: p = 0, no sparsity (HF applies _gaussian_topk only where activation_sparsity > 0)
        m.sparsity = [float(s) if float(s) != -math.inf else None for s in scales]
        m.n_altup = n

        def dense(name, shape):
            t = load_dense(gf, name)
            if tuple(t.shape) != tuple(shape):
                raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(t.shape)}, expected {tuple(shape)}")
            return t.to(device)

        # the stream projections (n-1, D, D), once per forward: float32 torch matmuls
        m.altup_proj = dense("altup_proj.weight", (n - 1, D, D))
        m.altup_unembd = dense("altup_unembd_proj.weight", (n - 1, D, D))
        m.altup_router, m.altup_router_norm, m.altup_predict, m.altup_correct = [], [], [], []
        m.altup_correct_scale, m.laurel_l, m.laurel_r, m.laurel_norm = [], [], [], []
        for i in range(L):
            p = f"blk.{i}."
            m.altup_router.append(dense(p + "altup_router.weight", (n, D)))          # tiny: dense float32
            m.altup_router_norm.append(load_vector(gf, p + "altup_router_norm.weight", device, D))
            m.altup_predict.append(dense(p + "altup_predict_coef.weight", (n * n, n)))
            m.altup_correct.append(dense(p + "altup_correct_coef.weight", (n, n)))
            m.altup_correct_scale.append(load_vector(gf, p + "altup_correct_scale.weight", device, D))
            rank = gf.tensor(p + "laurel_l.weight").shape[0]
            m.laurel_l.append(load_qweight(gf, p + "laurel_l.weight", device, (rank, D), dtype=dtype))
            m.laurel_r.append(load_qweight(gf, p + "laurel_r.weight", device, (D, rank), dtype=dtype))
            m.laurel_norm.append(load_vector(gf, p + "laurel_post_norm.weight", device, D))
        return m

    def qweights(self) -> list:
        return super().qweights() + list(self.laurel_l) + list(self.laurel_r)

    # ---- the forward ----

    def _modalities(self, z: torch.Tensor, i: int) -> torch.Tensor:
        """(T, D) -> (T, n): tanh(W_router RMSNorm(z; router_norm) / D) (gemma3n.cpp
        altup_compute_router_modalities; HF compute_router_modalities, router_input_scale = 1/D)."""
        r = ops.rms_norm(z, self.altup_router_norm[i], self.cfg.rms_eps) * (1.0 / self.cfg.d_model)
        return torch.tanh(r @ self.altup_router[i].t())

    def _altup_predict(self, X: torch.Tensor, i: int) -> torch.Tensor:
        """X (n, T, D) -> P_b = X_b + sum_a R[b, a] X_a, R = reshape(W_pred m(X_0), n, n) per token
        (HF Gemma3nTextAltUp.predict's permutes; gemma3n.cpp altup_predict)."""
        n, T = X.shape[0], X.shape[1]
        R = (self._modalities(X[0], i) @ self.altup_predict[i].t()).view(T, n, n)
        return X + torch.einsum("tba,atd->btd", R, X)

    def _altup_correct(self, P: torch.Tensor, o: torch.Tensor, i: int) -> torch.Tensor:
        """P (n, T, D), o (T, D) -> P_k + (W_corr m(o) + 1)_k * (o - P_0) (HF Gemma3nTextAltUp.correct;
        gemma3n.cpp altup_correct)."""
        coefs = self._modalities(o, i) @ self.altup_correct[i].t() + 1.0          # (T, n)
        return P + coefs.t().unsqueeze(-1) * (o - P[0]).unsqueeze(0)

    def _laurel(self, h: torch.Tensor, i: int, ctx) -> torch.Tensor:
        """h + RMSNorm(W_r W_l h; laurel_post_norm) (HF Gemma3nTextLaurelBlock; gemma3n.cpp laurel)."""
        t = ops.linear(ops.linear(h, self.laurel_l[i], None, ctx), self.laurel_r[i], None, ctx).float()
        return h.float() + ops.rms_norm(t, self.laurel_norm[i], self.cfg.rms_eps)

    def _mlp(self, h: torch.Tensor, blk: Block, i: int, ctx) -> torch.Tensor:
        """W_down(gelu_tanh(g) * W_up h), g = W_gate h, sparsified on the layers with a sparsity scale."""
        gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
        if self.sparsity[i] is not None:
            gate = gaussian_topk(gate, self.sparsity[i])
        return ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx).float()

    def _per_layer_out(self, first: torch.Tensor, i: int, ple, ctx) -> torch.Tensor:
        """RMSNorm(W_proj(gelu_tanh(W_inp_gate (first * correct_scale)) * ple[:, i]); post_norm)
        (HF Gemma3nTextDecoderLayer.forward's first_prediction; gemma3n.cpp)."""
        f = (first * self.altup_correct_scale[i]).to(self.act_dtype)
        g = ops.linear(f, self.ple_gate[i], None, ctx)
        g = ops.geglu(g, ple[:, i].contiguous().to(g.dtype))
        return ops.rms_norm(ops.linear(g, self.ple_proj[i], None, ctx).float(), self.ple_post_norm[i],
                            self.cfg.rms_eps)

    def _streams(self, x0: torch.Tensor) -> torch.Tensor:
        """(T, D) -> (n, T, D): x0 and its projections rescaled to x0's RMS (HF Gemma3nTextModel.forward)."""
        target = _rms(x0)
        ys = torch.einsum("ked,td->kte", self.altup_proj, x0)
        return torch.cat([x0.unsqueeze(0), ys * target / _rms(ys, MAGNITUDE_FLOOR)])

    def _merge(self, X: torch.Tensor) -> torch.Tensor:
        """(n, T, D) -> (T, D): the mean of X_0 and the unembedding projections of X_1.. rescaled to X_0's RMS."""
        target = _rms(X[0])
        ys = torch.einsum("ked,ktd->kte", self.altup_unembd, X[1:])
        return torch.cat([X[:1], ys * target / _rms(ys, MAGNITUDE_FLOOR)]).mean(0)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x0 = ops.embedding(tokens, self.token_embd) * self.embed_scale        # (T, D) float32
        ple = self._per_layer_inputs(tokens, x0, ctx)                          # (T, L, P)
        X = self._streams(x0)                                                  # (n, T, D) float32
        for i, blk in enumerate(self.blocks):
            P = self._altup_predict(X, i)
            a = P[0]
            h = ops.rms_norm(a, blk.attn_norm, eps).to(act)
            lr = self._laurel(h, i, ctx)
            attn = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.post_attention_norm[i], eps)
            y = (a + attn + lr) * (1.0 / math.sqrt(2.0))
            f = self._mlp(ops.rms_norm(y, blk.ffn_norm, eps).to(act), blk, i, ctx)
            o = y + ops.rms_norm(f, self.post_ffw_norm[i], eps)
            X = self._altup_correct(P, o, i)
            pl = self._per_layer_out(X[0], i, ple, ctx)
            X = torch.cat([X[:1], X[1:] + pl.unsqueeze(0)])
        z = self._merge(step.rows(X.transpose(0, 1)).transpose(0, 1))         # (R, D)
        h = ops.rms_norm(z, self.output_norm, eps).to(act)
        logits = self.head(h, ctx)
        cap = self.final_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits
