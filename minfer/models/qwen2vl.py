"""Qwen2-VL / Qwen2.5-VL language model: the GGUF arch `qwen2vl` (the vision tower is a separate
mmproj file, general.architecture `clip`, which minfer does not load: text input only).

The Qwen2 computation (models/qwen2.py: q/k/v biases, SwiGLU, RMSNorm) with M-RoPE
(llama_model_rope_type: LLM_ARCH_QWEN2VL -> LLAMA_ROPE_TYPE_MROPE; src/models/qwen2vl.cpp
ggml_rope_multi with `qwen2vl.rope.dimension_sections`, a required key: load_arch_hparams).

M-RoPE rotates the halves as NEOX does, but each rotary pair j takes its angle from one of four
positions (t, h, w, e) by its sector s = j mod sum(sections) (ggml-cpu ops.cpp
ggml_mrope_cache_init, not interleaved): s < s0 -> t, s < s0+s1 -> h, s < s0+s1+s2 -> w, else e.
For text tokens llama.cpp sets t = h = w = the token's position and e = 0
(llama-graph.cpp llm_graph_input_pos::set_input), and HF (modeling_qwen2_vl
apply_multimodal_rotary_pos_emb, sections of head_dim/2 split t/h/w; get_rope_index gives
text tokens three equal position ids) likewise. So with no 4th section (s3 = 0, what the
converter writes: conversion/base.py pads HF's three mrope_section values with 0) every pair
rotates by the token's position: exactly plain NEOX rope, which is what minfer runs. A file with
s3 > 0 would leave those pairs unrotated for text in llama.cpp, which HF has no counterpart
for: refused (check_text_rope). Image positions (h, w of a patch grid) need image embeddings,
which minfer cannot take.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.qwen2 import Qwen2Model


def rope_sections(gf, arch: str) -> list[int]:
    """`<arch>.rope.dimension_sections` (4 ints; required by llama.cpp's load_arch_hparams)."""
    key = f"{arch}.rope.dimension_sections"
    if key not in gf.metadata:
        raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model)")
    raw = gf.metadata[key]
    secs = [int(v) for v in (raw if isinstance(raw, list) else [raw])]
    secs = (secs + [0, 0, 0, 0])[:4]
    if any(s < 0 for s in secs) or sum(secs[:3]) <= 0:
        raise MinferError(f"{gf.path}: {key}={raw}: expected non-negative sections, some of t/h/w positive")
    return secs


def text_position_pairs(sections: list[int], n_pairs: int, interleaved: bool) -> list[bool]:
    """For each rotary pair j < n_pairs: whether llama.cpp rotates it by one of the t/h/w positions
    (all = the token's position for text) rather than by the 4th position (0 for text).
    Non-interleaved (MROPE): sector s = j mod sum(sections), t/h/w while s < s0+s1+s2.
    Interleaved (IMROPE, ggml_mrope_cache_init is_imrope): h if s%3 == 1 and s < 3*s1, w if
    s%3 == 2 and s < 3*s2, t if s%3 == 0 and s < 3*s0, else the 4th."""
    total = sum(sections)
    out = []
    for j in range(n_pairs):
        s = j % total
        if interleaved:
            out.append((s % 3 == 1 and s < 3 * sections[1]) or (s % 3 == 2 and s < 3 * sections[2])
                       or (s % 3 == 0 and s < 3 * sections[0]))
        else:
            out.append(s < sum(sections[:3]))
    return out


def check_text_rope(gf, cfg: ModelConfig, interleaved: bool) -> list[int]:
    """The sections, after checking that text tokens rotate as plain NEOX would: no 4th
    section (HF's M-RoPE has three; llama.cpp gives text tokens 0 there)."""
    secs = rope_sections(gf, cfg.arch)
    if secs[3] != 0:
        raise MinferError(f"{gf.path}: {cfg.arch}.rope.dimension_sections={secs} has a 4th section: its pairs "
                          f"take a position that only image input sets; minfer runs text input only")
    if cfg.rope.n_rot != cfg.head_dim:      # qwen2vl.cpp / qwen3vl.cpp: GGML_ASSERT(n_embd_head == n_rot)
        raise MinferError(f"{gf.path}: {cfg.arch} rotates the whole head (rope.dimension_count "
                          f"{cfg.rope.n_rot} != head size {cfg.head_dim})")
    return secs


class TextMRope:
    """The loading step the VL language models share (mixed in before their text model's class):
    the sections checked for text input (check_text_rope) and kept as `rope_sections`, plus each
    multimodal key the subclass names in `recorded_keys` (attribute -> metadata key suffix; a key
    that only matters for image input, kept for inspection)."""
    interleaved_mrope = False
    recorded_keys: dict[str, str] = {}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32):
        cfg = cfg or ModelConfig.from_gguf(gf)
        sections = check_text_rope(gf, cfg, cls.interleaved_mrope)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.rope_sections = tuple(sections)
        for attr, key in cls.recorded_keys.items():
            setattr(m, attr, int(gf.metadata.get(f"{cfg.arch}.{key}", 0) or 0))
        return m


class Qwen2VLModel(TextMRope, Qwen2Model):
    arch = "qwen2vl"
    rope_style = "neox"       # MROPE: NEOX halves; text positions equal in t/h/w (module docstring)
    interleaved_mrope = False
