"""Llama (and its many relatives, e.g. SmolLM2): the GGUF arch `llama`.

    x_0 = E[tokens]                                   token_embd      (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

RoPE: ggml NORM mode (adjacent pairs); the converter permuted attn_q/attn_k rows so this
equals HF's rotate_half on the original weights (see minfer/config.py).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.layers import Block, attention_branch, ffn_branch, load_block
from minfer.weights import QWeight, load_qweight, load_vector


class LlamaModel:
    arch = "llama"
    has_qkv_bias = False  # qwen2 overrides

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, blocks: list[Block],
                 output_norm: torch.Tensor, output: QWeight, act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        # dtype of the matmul inputs and of the KV cache: float32 on the CPU (the reference),
        # bf16 on CUDA (tensor cores, flash attention). The residual stream stays float32.
        self.act_dtype = act_dtype
        self.token_embd = token_embd      # (V, D)
        self.blocks = blocks
        self.output_norm = output_norm    # (D,)
        self.output = output              # (V, D); the same object as token_embd when tied

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True) -> "LlamaModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        # An untied embedding is only gathered row by row: keep it quantized on the CPU
        # (saves V*D*4 bytes: 545 MB for Qwen2.5-0.5B).
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        bar.update()
        blocks = []
        for i in range(cfg.n_layers):
            blocks.append(load_block(gf, cfg, i, device, dtype, biases=cls.has_qkv_bias))
            bar.update()
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = token_embd if cfg.tied_output else load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)
        bar.update()
        bar.close()
        return cls(cfg, token_embd, blocks, output_norm, output, act_dtype=activation_dtype(device))

    def qweights(self) -> list[QWeight]:
        """Every matrix of the model once (the tied output is the embedding)."""
        ws = [self.token_embd]
        for b in self.blocks:
            ws += [b.attn_q, b.attn_k, b.attn_v, b.attn_output, b.ffn_gate, b.ffn_up, b.ffn_down]
        if self.output is not self.token_embd:
            ws.append(self.output)
        return ws

    def forward(self, tokens: torch.Tensor, start_pos: int, cache, last_only: bool = False) -> torch.Tensor:
        """tokens (T,) int64 at positions start_pos.. -> logits (T, V) float32, or (1, V) with
        last_only. Appends the tokens' keys/values to `cache`."""
        T = tokens.shape[0]
        positions = torch.arange(start_pos, start_pos + T, device=tokens.device)
        return self._forward(tokens, start_pos, positions, cache, last_only)

    def decode_step(self, token: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        """One token (1,) at position pos, a (1,) int64 device tensor -> logits (1, V) float32.
        Nothing here depends on host values, so a CUDA graph can capture it once and replay it
        at every position (minfer/runtime/cuda_graphs.py)."""
        return self._forward(token, pos, pos, cache, last_only=False)

    def prefill_padded(self, tokens: torch.Tensor, positions: torch.Tensor, last: torch.Tensor, cache) -> torch.Tensor:
        """tokens (Tb,) from position 0, of which the first last+1 are real and the rest padding;
        last: a (1,) int64 device tensor -> logits (1, V) of the last real token. Causal attention
        keeps padding out of the real rows; the cache gets padding keys past the real tokens,
        which later tokens overwrite before anything attends to them. Host-value free: a CUDA
        graph captured at one padded length replays for every prompt length that rounds to it
        (minfer/runtime/prefill_graphs.py)."""
        return self._forward(tokens, 0, positions, cache, last_only=False, last_index=last)

    def _forward(self, tokens, start_pos, positions, cache, last_only: bool, last_index=None) -> torch.Tensor:
        # x: the float32 residual stream; h: its RMSNorm, in the matmuls' dtype. Each residual
        # add is done together with the norm that follows it (ops.add_rms_norm: one kernel
        # on CUDA unless MINFER_FUSED_ADD_NORM=0), so the loop is
        #   x, h = x + attn(h), ffn_norm(x + attn(h));   x, h = x + ffn(h), next_norm(x + ffn(h))
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, blocks[0].attn_norm, eps).to(act)      # (T, D) act
        for i, blk in enumerate(blocks):
            x, h = ops.add_rms_norm(x, attention_branch(h, blk, self.cfg, cache, i, start_pos, positions),
                                    blk.ffn_norm, eps, act)
            f = ffn_branch(h, blk)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act)
        if last_index is not None:                                 # only the rows whose logits are wanted
            x, f = x.index_select(0, last_index), f.index_select(0, last_index)   # (1, D)
        elif last_only:
            x, f = x[-1:], f[-1:]
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act)
        return ops.linear(h, self.output).float()                  # (T, V)


def activation_dtype(device) -> torch.dtype:
    """float32 on the CPU; on CUDA bf16 unless MINFER_ACT_DTYPE=float32 (read at load)."""
    import os

    if torch.device(device).type != "cuda":
        return torch.float32
    name = os.environ.get("MINFER_ACT_DTYPE", "bfloat16")
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
             "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        from minfer.errors import MinferError

        raise MinferError(f"MINFER_ACT_DTYPE={name!r}: expected one of {', '.join(table)}")
    return table[name]
