"""Make the deci fixture (NVIDIA's NAS-pruned Llamas: Llama-3.1-Nemotron-51B / Nano-8B, Llama-3.3-Nemotron-Super-49B;
HF DeciLMForCausalLM, remote code only): a tiny random HF checkpoint written by hand (config.json with block_configs,
model.safetensors), converted by llama.cpp's own converter (conversion/deci.py DeciModel), with an INDEPENDENT float64
torch forward written here from the DeciLM block semantics, and llama.cpp's own logits and greedy continuation as
goldens. transformers has no DeciLM class, so nothing here imports a model class; nothing imports minfer.

Two steps, in two environments (the tokenizer and the converter need transformers, the goldens llama-cpp-python):

    /work/tfvenv/bin/python tools/gen_deci_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_deci_fixture.py goldens

`build` writes, under tests/data/arch/:
  deci.gguf   convert_hf_to_gguf.py --outtype f16 (the 2-D weights rounded to float16 first, so the file holds exactly
              the weights the reference runs; norms and rope_freqs stay f32).
  deci.npz    ids (T,), logits (T, V): the independent forward (float64, stored float32) at every position;
              prompt (P,), greedy (N,): its greedy continuation (full recompute per token).
  deci.json   the config.json used, the seed, the per-layer kinds.
`goldens` adds to deci.npz: lcpp_logits (T, V), llama.cpp's logits of ids (Llama(logits_all) on an F32 copy of the
fixture, F32 KV cache, no flash attention), and lcpp_greedy (N,): llama.cpp's argmax continuation of prompt; and
the attention-without-FFN check: an F32 variant of the file with layer 1's FFN removed (feed_forward_length[1] = 0,
its ffn_* tensors dropped), llama.cpp's logits of it against the independent forward of the same variant
(variant_lcpp_vs_hf: DeciLM, the attention's output added) and of layer 1 skipped whole (variant_lcpp_vs_skip:
what deci.cpp's `continue` on n_ff == 0 computes); only the two errors are kept (build stores both variants' logits
for it). (With the FFN removed from the last layer instead, llama.cpp 0.3.36 aborts in the graph: GGML_ASSERT(buffer)
in ggml-backend.cpp, hence a middle layer.)

The DeciLM block semantics (HF modeling_decilm.py DeciLMDecoderLayer, as the released checkpoints ship it), per layer
block_configs[l] = {"attention": {...}, "ffn": {...}}:
  attention.no_op            no attention, no input_layernorm: x unchanged
  attention.replace_with_linear  x = x + W_lin RMSNorm(x)   (self_attn.linear_attn, D x D, no bias)
  else                       x = x + W_o attn(...) with H = num_attention_heads, Hkv = H // n_heads_in_group, Llama rope
  ffn.no_op (ffn_mult null)  no MLP, no post_attention_layernorm: x unchanged
  else                       x = x + W_down(silu(W_gate n(x)) * W_up n(x)), width
                             _find_multiple(int(2 * ffn_mult * D / 3), 256) (DeciLM's ffn_mult_to_intermediate_size)
The converter (conversion/deci.py DeciModel.__init__) maps these to head_count_kv[l] (0 for no-op and linear layers),
head_count[l] (0 for no-op, H for linear and attention) and feed_forward_length[l] (0 for ffn_mult null); it has no
tensor mapping for ffn.replace_with_linear (linear_mlp), so that kind is not in the fixture.

Shape: hidden 16, 2 heads of 8, rope base 10000 with llama3 scaling (factor 8, original context 64, so the rope_freqs
tensor the converter writes (DeciModel.generate_extra_tensors) has factors other than 1 at this size), 6 layers:
  0: attention, n_heads_in_group 2 (1 kv head)      FFN ffn_mult 1.0 -> 256
  1: attention, n_heads_in_group 1 (2 kv heads)     FFN ffn_mult 30  -> 512
  2: attention no_op                                FFN 256
  3: linear attention (replace_with_linear)         FFN 256
  4: attention no_op                                FFN no_op (ffn_mult null: the "dummy layer" of Nemotron Ultra)
  5: attention, n_heads_in_group 2                  FFN 256
The vocabulary: gen_arch_fixtures' tiny byte-level BPE. The converter's DeciModel.set_vocab takes a llama HF (SPM)
tokenizer unless vocab_size is 128256; it is patched to _set_vocab_gpt2 (what its 128256 branch does) and the
pre-tokenizer hash to 'gpt-2', as gen_arch_fixtures does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "deci"
SEED = 2468
D, H, DH, VOCAB, EPS = 16, 2, 8, 320, 1e-5
SEQ, PROMPT, NEW = 40, 8, 16
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}
THETA = 10000.0


def attn(group=None, no_op=False, linear=False):
    return {"n_heads_in_group": group, "no_op": no_op, "replace_with_linear": linear, "sparsify": None,
            "num_sink_tokens": None, "use_prefill_window_in_sink_attention": False, "unshifted_sink": False}


def ffn(mult=None, no_op=False):
    return {"ffn_mult": mult, "no_op": no_op, "replace_with_linear": False, "sparsify": None}


BLOCKS = [{"attention": attn(2), "ffn": ffn(1.0)},
          {"attention": attn(1), "ffn": ffn(30.0)},
          {"attention": attn(no_op=True), "ffn": ffn(1.0)},
          {"attention": attn(linear=True), "ffn": ffn(1.0)},
          {"attention": attn(no_op=True), "ffn": ffn(no_op=True)},
          {"attention": attn(2), "ffn": ffn(1.0)}]
# the converter's AutoTokenizer would read config.json through transformers' base config, which cannot take the llama3
# rope_scaling of an unknown model type: it is handed an empty config instead (the tokenizer needs none)
VARIANT = 1     # the layer whose FFN `goldens` removes for the attention-without-FFN check
CONVERT_PATCH = ("import conversion.deci as deci\n"
                 "deci.DeciModel.set_vocab = lambda self: self._set_vocab_gpt2()\n"
                 "import transformers\n"
                 "_tok = transformers.AutoTokenizer.from_pretrained\n"
                 "transformers.AutoTokenizer.from_pretrained = lambda *a, **k: _tok(*a, config=transformers.PretrainedConfig(), **k)\n")


def ffn_width(mult) -> int:
    """DeciLM's _ffn_mult_to_intermediate_size (conversion/deci.py copies it): 0 for a no-op FFN."""
    if mult is None:
        return 0
    n = int(2 * mult * D / 3)
    return n if n % 256 == 0 else n + 256 - n % 256


def config() -> dict:
    return {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas",
            "block_configs": BLOCKS, "hidden_size": D, "num_attention_heads": H, "num_hidden_layers": len(BLOCKS),
            "vocab_size": VOCAB, "rms_norm_eps": EPS, "max_position_embeddings": 256, "rope_theta": THETA,
            "rope_scaling": dict(ROPE), "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "torch_dtype": "float32"}


def make_weights(seed: int) -> dict:
    """HF names -> float32 tensors, every value float16-exact (2-D: N(0, 1.5/sqrt(fan_in)); norms 1 + N(0, 0.2))."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(rows, cols):
        return (torch.randn(rows, cols, generator=g) * (1.5 / cols ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    w = {"model.embed_tokens.weight": (torch.randn(VOCAB, D, generator=g)).half().float(),
         "model.norm.weight": norm(), "lm_head.weight": mat(VOCAB, D)}
    for i, b in enumerate(BLOCKS):
        p = f"model.layers.{i}."
        a, f = b["attention"], b["ffn"]
        if not a["no_op"]:
            w[p + "input_layernorm.weight"] = norm()
            if a["replace_with_linear"]:
                w[p + "self_attn.linear_attn.weight"] = mat(D, D)
            else:
                hkv = H // a["n_heads_in_group"]
                w[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
                w[p + "self_attn.k_proj.weight"] = mat(hkv * DH, D)
                w[p + "self_attn.v_proj.weight"] = mat(hkv * DH, D)
                w[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        if not f["no_op"]:
            F = ffn_width(f["ffn_mult"])
            w[p + "post_attention_layernorm.weight"] = norm()
            w[p + "mlp.gate_proj.weight"] = mat(F, D)
            w[p + "mlp.up_proj.weight"] = mat(F, D)
            w[p + "mlp.down_proj.weight"] = mat(D, F)
    return w


def inv_freq():
    """HF's llama3 rope (rope_utils _compute_llama3_parameters), float64."""
    import torch

    base = 1.0 / THETA ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    factor, lo, hi, old = (ROPE[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"))
    wavelen = 2 * math.pi / base
    out = torch.where(wavelen > old / lo, base / factor, base)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    return torch.where(medium, smoothed, out)


def forward(w: dict, ids: list[int], blocks=None):
    """The independent reference: DeciLM's forward of ids (float64) -> logits (T, V); blocks: BLOCKS or a variant."""
    import torch

    w = {k: v.double() for k, v in w.items()}
    T = len(ids)

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g

    def rot_half(x):
        x1, x2 = x[..., : DH // 2], x[..., DH // 2:]
        return torch.cat((-x2, x1), -1)

    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq()[None]     # (T, DH/2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i, b in enumerate(blocks or BLOCKS):
        p = f"model.layers.{i}."
        a, f = b["attention"], b["ffn"]
        if not a["no_op"]:
            h = rms(x, w[p + "input_layernorm.weight"])
            if a["replace_with_linear"]:
                x = x + h @ w[p + "self_attn.linear_attn.weight"].T
            else:
                hkv = H // a["n_heads_in_group"]
                q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, DH).transpose(0, 1)
                k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, hkv, DH).transpose(0, 1)
                v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, hkv, DH).transpose(0, 1)
                q, k = q * cos + rot_half(q) * sin, k * cos + rot_half(k) * sin
                k, v = k.repeat_interleave(H // hkv, 0), v.repeat_interleave(H // hkv, 0)
                s = (q @ k.transpose(1, 2)) / math.sqrt(DH) + mask
                o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, H * DH)
                x = x + o @ w[p + "self_attn.o_proj.weight"].T
        if not f["no_op"]:
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def build(llamacpp: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, make_tokenizer

    torch.manual_seed(SEED)
    w = make_weights(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config(), indent=1))
        save_file({k: v.contiguous() for k, v in w.items()}, str(d / "model.safetensors"), metadata={"format": "pt"})
        make_tokenizer(d)
        convert(d, OUT / f"{NAME}.gguf", llamacpp.resolve(), extra=CONVERT_PATCH)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    logits = forward(w, ids)
    seq = ids[:PROMPT]
    for _ in range(NEW):
        seq.append(int(forward(w, seq)[-1].argmax()))
    # the attention-without-FFN variant (module doc, VARIANT): DeciLM's logits, and those of the layer skipped whole
    # (what llama.cpp's `continue` computes); `goldens` compares llama.cpp's with both and keeps only the two errors
    keep = [dict(b) for b in BLOCKS]
    keep[VARIANT] = {"attention": BLOCKS[VARIANT]["attention"], "ffn": ffn(no_op=True)}
    skip = [dict(b) for b in BLOCKS]
    skip[VARIANT] = {"attention": attn(no_op=True), "ffn": ffn(no_op=True)}
    np.savez_compressed(OUT / f"{NAME}.npz", ids=np.array(ids, dtype=np.int64), logits=logits.float().numpy(),
                        prompt=np.array(ids[:PROMPT], dtype=np.int64),
                        greedy=np.array(seq[PROMPT:], dtype=np.int64),
                        variant_hf=forward(w, ids, keep).float().numpy(),
                        variant_skip=forward(w, ids, skip).float().numpy())
    kinds = [("none" if b["attention"]["no_op"] else "linear" if b["attention"]["replace_with_linear"]
              else f"attention kv={H // b['attention']['n_heads_in_group']}") + f", ffn {ffn_width(b['ffn']['ffn_mult'])}"
             for b in BLOCKS]
    (OUT / f"{NAME}.json").write_text(json.dumps({"config": config(), "seed": SEED, "layers": kinds,
                                                  "reference": "tools/gen_deci_fixture.py forward (float64)"},
                                                 indent=1, sort_keys=True) + "\n")
    top2 = np.sort(logits.numpy(), -1)[:, -2:]
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, greedy {seq[PROMPT:]}, "
          f"smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def lcpp_run(path: Path, ids: list[int], prompt: list[int]) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's logits of ids (every position) and its greedy continuation of prompt (NEW tokens)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(NEW):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    del llm
    return logits, out


def write_variant(src: Path, dst: Path) -> None:
    """An F32 copy of src with layer VARIANT's FFN removed: feed_forward_length[VARIANT] = 0, its ffn_* tensors
    dropped (what the converter writes for ffn_mult null on a layer with attention)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype, val = f.types[0], f.contents()
        if key == "general.file_type":
            val = 0                                             # LLAMA_FTYPE_ALL_F32
        if key == f"{NAME}.feed_forward_length":
            val = [0 if i == VARIANT else v for i, v in enumerate(val)]
        w.add_key_value(key, val, vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if t.name.startswith(f"blk.{VARIANT}.ffn_"):
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, x.reshape([int(d) for d in reversed(t.shape)]), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rel_err(got, ref) -> float:
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_embed_goldens import copy_with_keys

    r = dict(np.load(OUT / f"{NAME}.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(OUT / f"{NAME}.gguf", f32, {}, f32=True)
        r["lcpp_logits"], greedy = lcpp_run(f32, r["ids"].tolist(), r["prompt"].tolist())
        if "variant_hf" in r:
            var = Path(tmp) / "variant.gguf"
            write_variant(OUT / f"{NAME}.gguf", var)
            got, _ = lcpp_run(var, r["ids"].tolist(), r["prompt"].tolist())
            r["variant_lcpp_vs_hf"] = np.float32(rel_err(got, r.pop("variant_hf")))
            r["variant_lcpp_vs_skip"] = np.float32(rel_err(got, r.pop("variant_skip")))
            print(f"variant (layer {VARIANT} attention, no FFN): llama.cpp vs DeciLM {r['variant_lcpp_vs_hf']:.2e}, "
                  f"vs the layer skipped whole {r['variant_lcpp_vs_skip']:.2e}")
    r["lcpp_greedy"] = np.array(greedy, dtype=np.int64)
    np.savez_compressed(OUT / f"{NAME}.npz", **r)
    ref = r["logits"]
    err = rel_err(r["lcpp_logits"], ref)
    print(f"{NAME}: llama.cpp vs the independent forward: max rel err {err:.2e}; greedy {greedy} "
          f"(independent: {r['greedy'].tolist()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--llamacpp", required=True, type=Path)
    sub.add_parser("goldens")
    a = ap.parse_args()
    build(a.llamacpp) if a.cmd == "build" else goldens()


if __name__ == "__main__":
    main()
