"""What every architecture declares, and the step description one forward serves.

    logits = model.forward(tokens, step, cache, ctx)

- Every forward ends in `self.head(h, ctx)`: the lm head over the rows after the output norm.
  An embeddings run (runtime/embed.py) sets `hidden_sink` to take those rows instead; the head
  then hands them over and raises `HiddenTaken`, so no logits are computed.

- `Step` says where the tokens sit and which rows' logits are wanted. It replaces the old
  start_pos / positions / last_only / last_index arguments: the eager run, the decode CUDA
  graph and the padded prefill graph all call the same forward with a different Step.
- `cache` owns writing a step's keys/values and producing what attention reads (the cache
  protocol, docs/interfaces.md "Cache protocol"): the model calls `cache.write(layer, k, v,
  step)` then `cache.attend(layer, q, step, ctx)`, and never indexes the cache itself.
- `ctx` (minfer.ops.Context) carries the engine's switches and workspace to the ops.

A new architecture is one file in minfer/models/ with a subclass of `Model` (usually of
LlamaModel) registered in minfer/models/__init__.py; see README "Adding an architecture".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops


@dataclass(frozen=True)
class Step:
    """The positions of one forward's tokens and the rows whose logits are wanted.

    positions: (T,) int64 on the model's device, the position of each token.
    start:     the host-side position of the first token when the positions are
               start..start+T-1 (eager runs, padded prefill from 0); None when only the device
               tensor holds them (a CUDA-graph decode step: nothing may depend on host values).
    logits:    "all" (T rows), "last" (the last row), or a (R,) int64 device tensor of row
               indices (the padded prefill's last real token, chosen at replay time).
    """

    positions: torch.Tensor
    start: int | None
    logits: str | torch.Tensor = "all"

    @classmethod
    def at(cls, start: int, n: int, device, logits: str | torch.Tensor = "all") -> "Step":
        """n tokens at positions start.. (host-side start)."""
        return cls(torch.arange(start, start + n, device=device), int(start), logits)

    @property
    def n(self) -> int:
        return self.positions.shape[0]

    @property
    def attn_start(self):
        """What attention takes as the first position: the host int, or (start None) the (1,)
        device tensor of a one-token step."""
        return self.start if self.start is not None else self.positions[:1]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of x (T, ...) whose logits are wanted."""
        if isinstance(self.logits, torch.Tensor):
            return x.index_select(0, self.logits)
        if self.logits == "last":
            return x[-1:]
        if self.logits == "all":
            return x
        raise ValueError(f"Step.logits: expected 'all', 'last' or a tensor of rows, got {self.logits!r}")


class HiddenTaken(Exception):
    """Raised by Model.head when an embeddings run took the hidden rows (runtime/embed.py)."""


class Model:
    """The base of every architecture. Subclasses set the class attributes and implement
    `from_gguf` and `forward`; the runtime uses nothing else.

    Declarations (class attributes):
      arch        GGUF `general.architecture`
      rope_style  'normal' (ggml NORM: adjacent pairs) or 'neox' (halves), llama.cpp
                  llama_model_rope_type for this architecture
      qkv_bias    blk.N.attn_{q,k,v}.bias present
      qk_norm     blk.N.attn_{q,k}_norm.weight: RMSNorm of each head of q and k before rope
      paged_kv    the batch engine's paged KV cache (runtime/paged_kv.py) can run it (False:
                  `minfer serve` then serves one request at a time, and BatchEngine refuses it by
                  name; deepseek2's latent cache runs in it, V a view of K: its v_in_k)
      expert_gatings  the `expert_gating_func` values its MoE graph has, by ops.moe_ffn name
                  ("softmax" = 1, "sigmoid" = 2); a file asking for another is refused by name
      value_in_key  the cache's V rows are the first `attention.value_length` dims of its K rows
                  (deepseek2's MLA latent): ModelConfig.cache_v_in_k, KVCache stores K only
      recurrent   some layers carry state from position to position (granitehybrid's Mamba-2:
                  the cache's recurrent_state), which holds the whole cached sequence: the engine
                  re-uses a cached prefix only whole and never rewinds the cache (runtime/engine.py)
      causal      its attention is causal (each token sees the ones before it); False: an encoder (bert) whose
                  attention sees the whole input in one forward from position 0, for embeddings only (no lm head:
                  its head refuses to make logits). config.py accepts `{arch}.attention.causal` false only for
                  such a class, and requires it there; runtime/embed.py then runs the input as one chunk
      norm_eps_key  the `{arch}.` key of its norms' epsilon, required, read into cfg.rms_eps:
                  attention.layer_norm_rms_epsilon (RMSNorm), or attention.layer_norm_epsilon for a
                  LayerNorm graph (command-r, cohere2: llama.cpp LLM_KV_ATTENTION_LAYERNORM_EPS)
    Instance attributes: cfg (minfer.config.ModelConfig), act_dtype (matmul inputs and KV
    cache dtype), device.
    """

    arch: str = ""
    rope_style: str = "normal"
    qkv_bias: bool = False
    qk_norm: bool = False
    paged_kv: bool = True
    expert_gatings: tuple[str, ...] = ("softmax",)
    value_in_key: bool = False
    recurrent: bool = False
    causal: bool = True
    norm_eps_key: str = "attention.layer_norm_rms_epsilon"

    cfg = None
    act_dtype: torch.dtype = torch.float32
    hidden_sink = None      # a callable taking the head's input rows, set only during an embeddings run

    @classmethod
    def from_gguf(cls, gf, cfg, device="cpu", dtype=torch.float32, progress: bool = True,
                  act_dtype: torch.dtype = torch.float32) -> "Model":
        raise NotImplementedError

    @classmethod
    def block_passes(cls, gf) -> dict[int, int] | None:
        """How many times a token's forward runs each weight block blk.N of the file, where that is not
        once: {N: passes} (hrm_text's stacks, run in cycles over shared weights); None: every block once.
        The benchmark's roofline columns (bench.ModelStats) count a block's FLOPs and bytes per pass."""
        return None

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 of the rows step.logits
        names. Writes the tokens' keys/values through `cache`. Host-value free when step.start
        is None or step.logits is a tensor (CUDA graphs capture it once and replay it)."""
        raise NotImplementedError

    def head(self, h: torch.Tensor, ctx, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The lm head: h (R, D), the rows after the output norm (what llama.cpp calls result_norm
        and pools for embeddings) -> logits (R, V) float32. Architectures scale or cap the logits
        after this call; an embeddings run takes h before any of that (hidden_sink)."""
        if self.hidden_sink is not None:
            self.hidden_sink(h)
            raise HiddenTaken
        return ops.linear(h, self.output, bias, ctx, out_dtype=torch.float32)

    def qweights(self) -> list:
        """Every matrix (QWeight) of the model once (a tied lm head is the embedding)."""
        raise NotImplementedError

    def linear_groups(self) -> list[tuple]:
        """Tuples of QWeights the forward passes to ops.linear_many together, which the CUDA
        workspace fuses (one scratch, one GEMM): q/k/v per layer. gate/up are not a group:
        dequantized apart they need half the scratch at the same speed (docs/perf-log.md 10)."""
        return []

    def decode_groups(self) -> list[tuple]:
        """Weights the one-row decode multiplies as ONE GEMV when their repacked planes agree
        in type and K (gemv_repack_layout.fuse_group), or their raw blocks do where they stay raw
        (ops/cuda/gemv.fuse_raw_group; the memory stays the same either way): by default the
        linear groups, plus each block's (ffn_gate, ffn_up) where the model has them (ffn_branch
        passes them to ops.linear_many). Prefill still runs them apart."""
        out = list(self.linear_groups())
        for b in getattr(self, "blocks", ()):
            if getattr(b, "ffn_gate", None) is not None and getattr(b, "ffn_up", None) is not None:
                out.append((b.ffn_gate, b.ffn_up))
        return out

    def head_weights(self) -> list:
        """Matrices that do not size the prefill scratch: the embedding (a row gather) and the
        lm head (a prefill multiplies only the last row, by the GEMV)."""
        return []
