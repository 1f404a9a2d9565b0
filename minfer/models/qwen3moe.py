"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the GGUF arch `qwen3moe`.

Attention is Qwen3's (per-head q/k RMSNorm, NEOX rope, no biases: models/qwen3.py). The MLP of
every layer is a mixture of experts (llama.cpp src/models/qwen3moe.cpp, build_moe_ffn;
HF Qwen3MoeSparseMoeBlock):

    p      = softmax(W_router h)                    ffn_gate_inp   (E, D), float32 in the file
    top    = the K largest p (K = expert_used_count), weights w = p[top]
    w      = w / sum(w)                             when expert_weights_norm (see below)
    ffn(h) = sum_k w_k * W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)
             ffn_{gate,up}_exps (E, F_e, D), ffn_down_exps (E, D, F_e); F_e = expert_feed_forward_length

llama.cpp's qwen3moe graph always normalizes the top-K weights (build_moe_ffn(..., norm_w = true))
and the converter writes no key for HF's `norm_topk_prob`; a file that carries
`qwen3moe.expert_weights_norm` is obeyed (`weights_norm` below: the architecture's default). `qwen3moe.expert_gating_func`, when present, must be
softmax (1): the only gating this architecture's graph has.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_branch, load_head
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector


def load_experts(gf, name: str, device, shape: tuple[int, int, int], dtype=torch.float32) -> QWeight:
    """A stacked expert tensor (E, N, K) as one QWeight of shape (E*N, K): expert e's rows are
    [e*N, (e+1)*N) (ggml ne = {K, N, E}: rows of K values, N rows per expert). On the CPU it keeps
    only the file's blocks, no dense copy (Qwen3-30B-A3B's experts: 116 GB of float32):
    MINFER_CPU_QUANT packs each expert from its blocks (ops/cpu_experts.py); for the float32
    reference Engine.load then makes them dense (cpu_experts.densify_experts), and a weight left
    without one has the selected experts' rows decoded per step (ops/reference.py _expert)."""
    E, N, K = shape
    info = gf.tensor(name)
    if tuple(info.shape) != (E, N, K):
        raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, expected {(E, N, K)}")
    w = load_qweight(_Flat2D(gf, info, E * N), name, device, (E * N, K), dense=False, dtype=dtype)
    w.n_experts = E
    return w


class _Flat2D:
    """A GGUFFile stand-in that shows one 3-D tensor as 2-D (E*N, K), for load_qweight."""

    def __init__(self, gf, info, rows: int):
        from dataclasses import replace

        self.path = gf.path
        self._info = replace(info, shape=(rows, info.shape[-1]))

    def tensor(self, name):
        return self._info


@dataclass
class MoeBlock:
    """One layer's MoE weights (the attention weights live in the shared Block)."""

    gate_inp: torch.Tensor     # (E, D) float32: the router
    gate_exps: QWeight         # (E*F_e, D)
    up_exps: QWeight           # (E*F_e, D)
    down_exps: QWeight         # (E*D, F_e)
    gate_inp_shexp: torch.Tensor | None = None   # (D,)        qwen2moe: the shared expert's gate
    gate_shexp: QWeight | None = None            # (F_s, D)
    up_shexp: QWeight | None = None              # (F_s, D)
    down_shexp: QWeight | None = None            # (D, F_s)

    def matrices(self) -> list[QWeight]:
        """The stacked experts, then the shared expert's matrices that exist."""
        return [w for w in (self.gate_exps, self.up_exps, self.down_exps, self.gate_shexp, self.up_shexp,
                            self.down_shexp) if w is not None]


def stacked_experts(moe: list) -> list[QWeight]:
    """Every layer's stacked experts (moe: per layer a block with gate/up/down_exps, or None). ops.moe_ffn
    decodes the rows it needs itself, so they never go through ops.linear's scratch nor size it
    (Model.head_weights)."""
    return [w for e in moe if e is not None for w in (getattr(e, "gate_exps", None), e.up_exps, e.down_exps)
            if w is not None]                                  # ungated experts (nemotron_h_moe) have no gate


class Qwen3MoeModel(LlamaModel):
    arch = "qwen3moe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_QWEN3MOE -> NEOX
    qk_norm = True
    weights_norm = True       # src/models/qwen3moe.cpp: build_moe_ffn(..., norm_w = true, ...)
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length")    # required

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        """Each expert's hidden size (qwen3moe: expert_feed_forward_length)."""
        return cfg.expert_ffn

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Qwen3MoeModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, Dh, E, Fe = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_experts, cls.expert_width(cfg)
        for key in cls.expert_keys:
            if f"{cls.arch}.{key}" not in gf.metadata:
                raise MinferError(f"{gf.path}: metadata key '{cls.arch}.{key}' is missing "
                                  f"(needed to build the {cls.arch} model)")
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe = [], []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            blk = Block(
                attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                attn_output=w("attn_output", (D, q_out)),
                ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                ffn_gate=None, ffn_up=None, ffn_down=None)
            if cls.qk_norm:
                blk.attn_q_norm = load_vector(gf, p + "attn_q_norm.weight", device, Dh)
                blk.attn_k_norm = load_vector(gf, p + "attn_k_norm.weight", device, Dh)
            if cls.qkv_bias:
                blk.attn_q_bias = load_vector(gf, p + "attn_q.bias", device, q_out)
                blk.attn_k_bias = load_vector(gf, p + "attn_k.bias", device, kv_out)
                blk.attn_v_bias = load_vector(gf, p + "attn_v.bias", device, kv_out)
            blocks.append(blk)
            router = load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D)
            moe.append(MoeBlock(
                gate_inp=router,
                gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, Fe, D), dtype),
                up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, Fe, D), dtype),
                down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, Fe), dtype)))
            cls.load_shared(gf, cfg, moe[-1], i, device, dtype)
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe = moe
        m.weights_norm = cls.weights_norm if cfg.expert_weights_norm is None else cfg.expert_weights_norm
        return m

    @classmethod
    def load_shared(cls, gf, cfg, e: "MoeBlock", i: int, device, dtype) -> None:
        """Extra per-layer FFN weights (qwen2moe's shared expert); none here."""

    def ffn(self, h: torch.Tensor, e: "MoeBlock", ctx) -> torch.Tensor:
        """The layer's MoE FFN of the normed input h (T, D) -> (T, D)."""
        return ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, self.cfg.n_experts_used,
                           self.weights_norm, ctx)

    def shared_expert(self, h: torch.Tensor, e: "MoeBlock", ctx) -> torch.Tensor:
        """The shared expert's SwiGLU W_down_s(silu(W_gate_s h) * W_up_s h) (qwen2moe, granitemoe)."""
        return ops.linear(ops.swiglu(ops.linear(h, e.gate_shexp, None, ctx), ops.linear(h, e.up_shexp, None, ctx)),
                          e.down_shexp, None, ctx)

    def layer_matrices(self, i: int) -> list[QWeight]:
        e = self.moe[i]      # None: a dense layer (its FFN in the Block)
        return super().layer_matrices(i) + ([] if e is None else e.matrices())

    def head_weights(self) -> list:
        return super().head_weights() + stacked_experts(self.moe)

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention branch of the normed input h (T, D) -> (T, D) (olmoe: its own q/k norms)."""
        return attention_branch(h, blk, self.cfg, cache, i, step, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            x, h = ops.add_rms_norm(x, self.attention(h, blk, i, cache, step, ctx), blk.ffn_norm, eps, act, ctx)
            f = self.ffn(h, e, ctx)                                    # (T, D)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
