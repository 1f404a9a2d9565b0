"""Shared pieces of the float64 torch reference forwards that several tools/gen_*_fixture.py generators write from
an architecture's description (the generators keep each architecture's own rules; these are the common Llama-family
parts), and the build step's tail. Nothing here imports minfer; torch is imported where a function runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def rms_norm(x, w, eps: float):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * w (eps inside the root)."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def neox_rope(n: int, dh: int, theta: float):
    """rope(x) for x (n, heads, dh) at positions 0..n-1, base theta, over the whole head in HALVES: HF's rotate_half
    (emb = cat(freqs, freqs); x * cos + rotate_half(x) * sin), llama.cpp's NEOX rope type: dims i and i + dh/2 turn
    by pos * theta^(-2i/dh)."""
    import torch

    pos = torch.arange(n, dtype=torch.float64)
    inv = theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)          # (n, dh)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]            # (n, 1, dh)

    def rope(x):
        x1, x2 = x[..., :dh // 2], x[..., dh // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    return rope


def causal_attention(q, k, v):
    """q (T, H, Dh), k and v (T, KV, Dh) -> (T, H * Dh): GQA (kv head j serves query heads j * H/KV ..
    j * H/KV + H/KV - 1: HF repeat_kv), causal softmax(q k / sqrt(Dh)) v."""
    import torch

    T, H, DH = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    s = torch.einsum("thd,shd->hts", q, k) / DH ** 0.5 + mask
    return torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * DH)


def swiglu(h, gate, up, down):
    """The SwiGLU MLP without biases: down(silu(gate h) * up h)."""
    import torch

    return (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T


def routed_experts(out, h, wt, sel, n_expert: int, expert):
    """The routed experts' sum added into out (T, D) in place and returned: out[t] += sum_j wt[t, j] *
    expert(e, h[t]) over the chosen e = sel[t, j] (wt, sel: (T, K)); each expert runs once per slot j on the rows
    that chose it (HF Mixtral's loop)."""
    for j in range(sel.shape[1]):
        for e in range(n_expert):
            rows = sel[:, j] == e
            if rows.any():
                out[rows] += wt[rows, j, None] * expert(e, h[rows])
    return out


def greedy(forward, prompt: list[int], n: int) -> list[int]:
    """n greedy ids after prompt; forward(ids) -> (T, V) logits."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(forward(ids)[-1].argmax()))
    return ids[len(prompt):]


def finish(out: Path, name: str, arrays: dict, meta: dict, forward, n_prompt: int, n_new: int,
           note: str = "") -> None:
    """The build step's tail: prompt (the first n_prompt of arrays["ids"]) and greedy (forward's n_new greedy ids
    after it) added to arrays; out/name.npz (arrays) and out/name.json (meta) written; the GGUF's size, the greedy
    ids and the smallest top-1/top-2 gap of arrays["logits"] printed, then note."""
    prompt = arrays["ids"][:n_prompt].tolist()
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = np.array(greedy(forward, prompt, n_new), dtype=np.int64)
    np.savez_compressed(out / f"{name}.npz", **arrays)
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{name}: {(out / f'{name}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}{note}")


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest over rows of max |got - ref| / max |ref|."""
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def checkpoint_to_gguf(out: Path, name: str, llamacpp: Path, tensors: dict, files: dict, tokenizer,
                       keep_f32=lambda key, value: False, extra: str = "") -> None:
    """A Hugging Face checkpoint directory `name` (tokenizer(dir) first, then files' {file name: JSON object},
    then model.safetensors: every tensor float16 but where keep_f32(key, tensor)) converted to out/name.gguf by
    llama.cpp's convert_hf_to_gguf.py reading config.json as written (gen_arch_fixtures.convert raw_config: the
    remote-code model types AutoConfig does not know); extra: code the converter's process runs first
    (gen_arch_fixtures.convert's `extra`)."""
    import sys
    import tempfile

    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        d.mkdir()
        tokenizer(d)
        for fname, obj in files.items():
            (d / fname).write_text(json.dumps(obj, indent=1))
        save_file({k: v.contiguous() if keep_f32(k, v) else v.half().contiguous() for k, v in tensors.items()},
                  d / "model.safetensors", metadata={"format": "pt"})
        convert(d, out / f"{name}.gguf", llamacpp, raw_config=True, extra=extra)


def cli(doc: str, build, goldens, build_needs: str, goldens_gives: str = "logits and greedy ids") -> None:
    """A generator's command line: `build --llamacpp DIR` (build(DIR)) or `goldens` (goldens())."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help=f"the GGUF file and the torch reference (needs {build_needs})")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help=f"llama.cpp's {goldens_gives} (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()
