"""The in-run yardstick of `minfer bench --peer torch-bf16`: the same GGUF, dequantized to
bf16, run by a plain functional torch forward (F.linear -> cuBLAS, SDPA -> flash/cuDNN
attention with GQA). It shares no code with minfer's engine (it reads the GGUF keys itself),
so a bug or a slowdown in the engine cannot hide in both. The weights are decoded by
minfer/bench/peer_dequant.py (torch ops on the GPU), checked against the gguf package.

Llama and Qwen2 as llama.cpp runs them (src/llama-model.cpp): RMSNorm, RoPE (llama: NORM =
adjacent pairs, since convert_hf_to_gguf permutes q/k rows; qwen2: NEOX = halves), grouped-
query causal attention, SwiGLU MLP, tied output when there is no output.weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minfer.errors import MinferError

PEERS = ("torch-bf16",)


# The architectures this peer's own forward implements (a subset of minfer.models.ARCHITECTURES,
# whose declarations give the rope style): the llama block, with qwen2's q/k/v biases.
PEER_ARCHS = ("llama", "qwen2")


# The tensors the peer's forward reads (a block's by its name after "blk.N."; rope_freqs, llama 3's long-context
# factors, changes no matmul or kernel the peer times and is left out of its rope). A file holding any other
# tensor (Mixtral's experts, InternLM3's o / MLP biases) is a model this forward does not compute: refused before
# anything loads, so no minfer run is measured and then thrown away by a failing peer.
PEER_BLOCK_TENSORS = frozenset(
    ["attn_norm.weight", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
     "ffn_down.weight"] + [f"attn_{x}.{y}" for x in "qkv" for y in ("weight", "bias")])
PEER_OTHER_TENSORS = frozenset(["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"])


def check_peer_file(gf) -> None:
    """A MinferError naming the file and the first tensor (or the architecture) the torch peer does not run."""
    arch = gf.architecture
    if arch not in PEER_ARCHS:
        raise MinferError(f"{gf.path}: the torch peer runs {', '.join(PEER_ARCHS)}, not '{arch}'")
    for name in gf.tensors:
        if name.startswith("blk."):
            parts = name.split(".", 2)
            known = len(parts) == 3 and parts[1].isdigit() and parts[2] in PEER_BLOCK_TENSORS
        else:
            known = name in PEER_OTHER_TENSORS
        if not known:
            raise MinferError(f"{gf.path}: tensor '{name}' is not part of the torch peer's {arch} block (it runs "
                              "the dense llama / qwen2 block with optional q/k/v biases): --peer torch-bf16 "
                              "cannot run this model")


class TorchPeer:
    """A whole model as plain tensors; forward(ids, start_pos) -> logits, like Engine.forward."""

    def __init__(self, gf, device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 n_ctx: int = 4096):
        from minfer.models import ARCHITECTURES

        check_peer_file(gf)
        arch = gf.architecture
        g = gf.arch_get
        self.arch, self.device, self.dtype, self.n_ctx = arch, torch.device(device), dtype, n_ctx
        self.n_layers = int(g("block_count"))
        self.d = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_kv = int(g("attention.head_count_kv") or self.n_head)
        self.hd = int(g("attention.key_length") or self.d // self.n_head)
        self.eps = float(g("attention.layer_norm_rms_epsilon"))
        n_rot = int(g("rope.dimension_count") or self.hd)
        theta = float(g("rope.freq_base") or 10000.0)
        self.neox = ARCHITECTURES[arch].rope_style == "neox"   # the model class's declaration
        # (n_rot/2,) float32 inverse frequencies theta^(-2i/n_rot)
        self.inv_freq = (theta ** (-torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot)).float().to(self.device)
        self.n_rot = n_rot
        self.w = self._load(gf)
        self.head = self.w.get("output.weight", self.w["token_embd.weight"])
        self.vocab = self.head.shape[0]
        kv_shape = (self.n_layers, n_ctx, self.n_kv, self.hd)
        self.k_cache = torch.zeros(kv_shape, dtype=dtype, device=self.device)
        self.v_cache = torch.zeros(kv_shape, dtype=dtype, device=self.device)

    def _load(self, gf) -> dict[str, torch.Tensor]:
        """Every tensor as `dtype` on the device (norms float32): raw blocks uploaded and
        decoded there by peer_dequant (seconds for the 7B on a GPU), one tensor at a time."""
        from minfer.bench.peer_dequant import load_dequantized

        return {name: load_dequantized(t, self.device, torch.float32 if name.endswith("norm.weight")
                                       else self.dtype)
                for name, t in gf.tensors.items()}

    # ---------------------------------------------------------------- layers

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """(T, D) -> (T, D): float32 statistics, like ggml_rms_norm."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * w).to(self.dtype)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """(T, H, hd) rotated by position (T,): the first n_rot dims of each head."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]          # (T, n_rot/2)
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]        # (T, 1, n_rot/2)
        xr, rest = x[..., : self.n_rot].float(), x[..., self.n_rot:]
        if self.neox:   # pairs (i, i + n_rot/2)
            a, b = xr[..., : self.n_rot // 2], xr[..., self.n_rot // 2:]
            out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        else:           # adjacent pairs (2i, 2i+1)
            a, b = xr[..., 0::2], xr[..., 1::2]
            out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        return torch.cat([out.to(x.dtype), rest], dim=-1)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  start_pos: int) -> torch.Tensor:
        """q (T, H, hd), k/v (T, Hkv, hd) appended to the cache -> (T, H * hd)."""
        T = q.shape[0]
        S = start_pos + T
        self.k_cache[layer, start_pos:S] = k
        self.v_cache[layer, start_pos:S] = v
        qh = q.transpose(0, 1)[None]                                   # (1, H, T, hd)
        # GQA by repeating each kv head for its query heads (what gpt-fast does): every SDPA
        # backend, flash included, takes equal head counts
        rep = self.n_head // self.n_kv
        kh = self.k_cache[layer, :S].repeat_interleave(rep, dim=1).transpose(0, 1)[None]  # (1, H, S, hd)
        vh = self.v_cache[layer, :S].repeat_interleave(rep, dim=1).transpose(0, 1)[None]
        if T == 1:             # one new token sees every cached position
            o = F.scaled_dot_product_attention(qh, kh, vh)
        elif start_pos == 0:   # square causal: the flash kernels' case
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:                  # query i at position start_pos + i sees keys 0..start_pos + i
            from torch.nn.attention.bias import causal_lower_right

            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(T, S))
        return o[0].transpose(0, 1).reshape(T, -1)

    # ---------------------------------------------------------------- forward

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start_pos: int, last_only: bool = False) -> torch.Tensor:
        """ids (T,) int64 at positions start_pos.. -> logits (T or 1, vocab) float32."""
        T = ids.shape[0]
        if start_pos + T > self.n_ctx:
            raise MinferError(f"torch peer: {start_pos + T} tokens exceed its context of {self.n_ctx}")
        w = self.w
        ids = ids.to(self.device)
        pos = torch.arange(start_pos, start_pos + T, device=self.device)
        x = F.embedding(ids, w["token_embd.weight"])                   # (T, D)
        for i in range(self.n_layers):
            b = f"blk.{i}."
            h = self.rms_norm(x, w[b + "attn_norm.weight"])
            q = F.linear(h, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")).view(T, self.n_head, self.hd)
            k = F.linear(h, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")).view(T, self.n_kv, self.hd)
            v = F.linear(h, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")).view(T, self.n_kv, self.hd)
            a = self.attention(i, self.rope(q, pos), self.rope(k, pos), v, start_pos)
            x = x + F.linear(a, w[b + "attn_output.weight"])
            h = self.rms_norm(x, w[b + "ffn_norm.weight"])
            g = F.silu(F.linear(h, w[b + "ffn_gate.weight"])) * F.linear(h, w[b + "ffn_up.weight"])
            x = x + F.linear(g, w[b + "ffn_down.weight"])
        if last_only:
            x = x[-1:]
        x = self.rms_norm(x, w["output_norm.weight"])
        return F.linear(x, self.head).float()


def check_peer(name: str, device: str) -> None:
    if name not in PEERS:
        raise MinferError(f"--peer {name!r}: unknown peer (expected one of {', '.join(PEERS)})")
    if device != "cuda":
        raise MinferError("--peer torch-bf16 runs on CUDA only (bf16 matmuls on the CPU would "
                          "measure nothing useful); use --device cuda")


def load_peer(name: str, gf, device: str, n_ctx: int) -> TorchPeer:
    check_peer(name, device)
    return TorchPeer(gf, device="cuda", dtype=torch.bfloat16, n_ctx=n_ctx)
