"""Make the architecture fixtures in tests/data/arch/: tiny random Hugging Face models, converted
to GGUF by llama.cpp's own converter, with transformers' float32 logits and greedy continuations.

    pip install transformers            # a tool dependency only: CI reads the committed fixtures
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/arch
    python tools/gen_arch_fixtures.py --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp

For each architecture (ARCHS, in tools/arch_fixture_configs.py) this writes, under tests/data/arch/:
  <name>.gguf        convert_hf_to_gguf.py --outtype f16 of the random model. The random 2-D
                     weights are rounded to float16 before anything else, so the f16 file holds
                     exactly the weights transformers ran (norms and rope factors stay f32).
  <name>.npz         ids (T,) and logits (T, V) float32: transformers' forward of every position;
                     prompt (P,) and greedy (N,): generate(do_sample=False) after the prompt;
                     for phi3 also ids_long / logits_long (a sequence past the original context,
                     where its long rope factors apply).
  <name>.json        the HF config used (for the record) and the transformers version.

The vocabulary is a tiny byte-level BPE (a few hundred tokens) trained here with `tokenizers`.
llama.cpp's converter names the pre-tokenizer by hashing how a tokenizer splits a fixed text and
refuses a hash it does not know; this tokenizer is new, so the converter is run with
get_vocab_base_pre patched to answer 'gpt-2' (the architectures, not the tokenizer, are under test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# the configs, one per fixture (tools/ is on sys.path when this runs as a script)
from arch_fixture_configs import ARCHS, VOCAB
import bitnet_fixture  # the BitNet fixtures' steps (its docstring)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
EXTRA_SPECIALS = {"glm4": ("<|endoftext|>", "<|user|>"),   # conversion/glm.py Glm4Model.set_vocab looks them up
                  "chatglm": ("<|endoftext|>", "<|user|>"),   # conversion/chatglm.py ChatGLMModel.set_vocab too
                  "glm4moe": ("<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>")}   # _set_vocab_glm
SPM = {"ernie4_5", "ernie4_5-moe", "ernie4_5-moe-step2", "nemotron", "nemotron-bias", "jamba"}     # converters that take a SentencePiece model only (make_spm_tokenizer)
SPM |= {"minicpm3"}   # conversion/minicpm.py MiniCPM3Model.set_vocab: _set_vocab_sentencepiece
SPM |= set(bitnet_fixture.NAMES)   # conversion/bitnet.py BitnetModel.set_vocab: _set_vocab_sentencepiece
# biases drawn around 0, not around 1 as the other 1-D parameters (norm weights): qwen2vl's q/k/v biases of
# ~1 made one token win everywhere
CENTERED_BIAS = {"qwen2vl", "starcoder2", "stablelm", "stablelm-12b", "nemotron-bias", "phi2"}
CENTERED_BIAS |= {"bloom"}   # BLOOM: biases on every linear and norm
CENTERED_BIAS |= {"starcoder"}   # StarCoder 1: biases on every linear and norm
CENTERED_BIAS |= {"gptneox", "gptneox-seq", "gpt2"}   # GPT-NeoX, GPT-2: biases on every linear and norm
CENTERED_BIAS |= {"jais2"}   # Jais-2: biases on every linear and norm
SEQ = 40          # tokens of the logits reference (past gemma3's sliding window of 8)
PROMPT, NEW = 8, 16
# LongRoPE fixtures: a reference inside the original context (24 tokens: short factors) and one past it (long)
LONGROPE = ("phi3", "minicpm3")

# transformers 5 saves layer_types as "linear_attention" / "full_attention"; llama.cpp's converter
# (conversion/granite.py GraniteHybridModel.get_attn_layers) takes the released names "mamba" / "attention"
LAYER_TYPES_AS_RELEASED = {"granitehybrid", "granitehybrid-dense"}


def nemotron_h_as_released(c: dict) -> dict:
    """NemotronHConfig (transformers 5) saves the block pattern as layers_block_type, a list whose MLP blocks are
    "mlp"; llama.cpp's converter (conversion/nemotron.py NemotronHModel) counts only "moe" as an MLP block in a
    list and reads the released configs' hybrid_override_pattern string ("M", "-", "*", "E") as written. The
    released config, read as config.json (raw_config below: transformers' AutoConfig would turn the string back
    into the list)."""
    marks = {"linear_attention": "M", "mlp": "-", "full_attention": "*", "moe": "E"}
    pattern = "".join(marks[t] for t in c.pop("layers_block_type"))
    c.pop("layer_types", None)
    if "E" not in pattern:      # a dense release carries no MoE keys (the converter takes num_experts_per_tok as MoE)
        for k in [k for k in c if k.startswith(("moe_", "n_routed", "n_shared", "num_experts", "mtp_", "num_nextn"))
                  or k in ("routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob")]:
            del c[k]
    return {**c, "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern)}


def exaone_as_released(c: dict) -> dict:
    """ExaoneConfig (transformers 5) saves the Llama names and LlamaForCausalLM; the released config.json
    (EXAONE-3.5) names ExaoneForCausalLM, which llama.cpp's converter registers, and activation_function, which
    conversion/exaone.py ExaoneModel asserts is silu (transformers' AutoConfig would drop the alias)."""
    return {**c, "architectures": ["ExaoneForCausalLM"], "activation_function": c["hidden_act"]}

# the Qwen3.5 / Qwen3-Next converters (conversion/qwen.py _QwenMtpMixin) expect MTP tensors unless told there are none
NO_MTP = {"qwen35", "qwen35moe", "qwen3next"}
# transformers loads the tokenizer of model_type qwen3_5_moe_text as Qwen3_5Tokenizer, which adds <|endoftext|>
# past the vocabulary unless it is there
EXTRA_SPECIALS["qwen35moe"] = ("<|endoftext|>",)
EXTRA_SPECIALS["qwen3next"] = ("<|endoftext|>",)
# conversion/glm.py: Glm4MoeLiteModel.set_vocab is _set_vocab_glm (glm4moe's tokens); SolarOpenModel.set_vocab looks up
# <|endoftext|>, <unk> and <|startoftext|>
EXTRA_SPECIALS["glm4moe-lite"] = EXTRA_SPECIALS["glm4moe"]
EXTRA_SPECIALS["solar-open"] = ("<|endoftext|>", "<unk>", "<|startoftext|>")

def gptneox_as_released(c: dict) -> dict:
    """GPTNeoXConfig (transformers 5) saves the rotary fraction and base in rope_parameters; the released
    config.json (Pythia) has rotary_pct and rotary_emb_base, and conversion/gptneox.py reads rotary_pct."""
    rp = c.get("rope_parameters") or {}
    return {**c, "rotary_pct": rp.get("partial_rotary_factor", 0.25), "rotary_emb_base": rp.get("rope_theta", 10000)}


def gpt2_as_released(c: dict) -> dict:
    """GPT2Config (transformers 5) saves no n_ctx; the released config.json has it (= n_positions), and
    conversion/gpt2.py writes context_length from it."""
    return {**c, "n_ctx": c["n_positions"]}


# configs rewritten to the released form, then read by the converter from config.json as written
CONFIG_AS_RELEASED = {"nemotron_h": nemotron_h_as_released, "nemotron_h_moe": nemotron_h_as_released,
                      "nemotron_h_moe-latent": nemotron_h_as_released, "exaone": exaone_as_released}
CONFIG_AS_RELEASED |= {"gptneox": gptneox_as_released, "gptneox-seq": gptneox_as_released,
                       "gpt2": gpt2_as_released}

# transformers 5 keeps Qwen3-VL-MoE's packed experts as gate_up_proj (E, 2F, D), down_proj (E, D, F) and saves
# them so; the released checkpoints (and llama.cpp's converter, conversion/qwen3vl.py
# Qwen3VLMoeTextModel.modify_tensors) have them transposed: (E, D, 2F), (E, F, D) (transformers'
# conversion_mapping.py "qwen3_vl_moe": Transpose(1, 2) on load)
EXPERTS_AS_RELEASED = {"qwen3vlmoe"}


# transformers 5 saves KimiLinear's leading dense MLP under block_sparse_moe. (its conversion_mapping.py reverses the
# MoE layers' mlp. -> block_sparse_moe. rename on every layer); the release names it mlp.{gate,up,down}_proj, which
# llama.cpp's converter maps (gguf-py tensor_mapping: model.layers.{bid}.mlp.*)
DENSE_MLP_AS_RELEASED = {"kimi-linear"}


def dense_mlp_as_released(model_dir: Path) -> None:
    """Rename block_sparse_moe.{gate,up,down}_proj (the dense layers') to mlp.* in the saved tensors (in place)."""
    import re

    from safetensors.torch import load_file, save_file

    for f in model_dir.glob("*.safetensors"):
        ts = load_file(f)
        save_file({re.sub(r"\.block_sparse_moe\.((gate|up|down)_proj)\.", r".mlp.\1.", k): v for k, v in ts.items()},
                  f, metadata={"format": "pt"})


def experts_as_released(model_dir: Path) -> None:
    """Transpose the saved packed expert tensors to the released checkpoints' layout (in place)."""
    from safetensors.torch import load_file, save_file

    for f in model_dir.glob("*.safetensors"):
        ts = load_file(f)
        for k in ts:
            if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                ts[k] = ts[k].transpose(1, 2).contiguous()
        save_file(ts, f, metadata={"format": "pt"})


def make_tokenizer(path: Path, extra_specials=()) -> None:
    """A byte-level BPE of VOCAB tokens (ids 0-2 special, then extra_specials) saved as a
    transformers tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") + "\n") * 2
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=VOCAB, min_frequency=2,
                            special_tokens=["<pad>", "<s>", "</s>", *extra_specials], show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def make_spm_tokenizer(path: Path) -> None:
    """A SentencePiece BPE of VOCAB pieces (tokenizer.model), for converters that read only that
    (llama.cpp conversion/ernie.py: _set_vocab_sentencepiece)."""
    import io

    import sentencepiece as spm

    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") + "\n") * 2
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()), model_writer=buf, vocab_size=VOCAB,
                                   model_type="bpe", byte_fallback=False, character_coverage=0.98,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (path / "tokenizer.model").write_bytes(buf.getvalue())


def randomize(model, seed: int, centered_bias: bool = False) -> None:
    """Weights large enough that the logits are far from uniform (greedy has clear winners),
    norm weights away from their identity value (so a missed +1 or a skipped norm shows), and
    every float rounded to float16 (so the f16 GGUF holds exactly what transformers runs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:        # RMSNorm weights (gemma3 stores w with y = x * (1 + w))
                cls = type(model).__name__.lower()
                # gemma4 and gemma3n: y = x * w (gemma3n's altup correct_output_scale too: ones around 1)
                base = 0.0 if "gemma" in cls and "gemma4" not in cls and "gemma3n" not in cls else 1.0
                if centered_bias and name.endswith(".bias"):
                    base = 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))
            if name.endswith("self_attn.sinks"):     # gpt-oss: sinks spread around the scores' scale
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            if name.endswith("experts.gate_up_proj"):  # gpt-oss: gate/up values past the clamp at 7
                p.mul_(6.0)
            if name.endswith("e_score_correction_bias"):   # ernie4_5-moe's selection bias (a parameter there)
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            if name.endswith("mlp.expert_bias"):          # afmoe's selection bias (a parameter, zeros at init)
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):   # glm4moe's selection bias: a zeros buffer at init
                b.copy_((0.3 * torch.randn(b.shape, generator=g)).half().float())
            if name.endswith("feed_forward.expert_bias"):  # lfm2moe's selection bias: a zeros buffer at init
                b.copy_((0.3 * torch.randn(b.shape, generator=g)).half().float())
            if name.endswith("layer_scalar"):             # gemma4's per-layer output scale: ones at init
                b.copy_((0.5 + torch.rand(b.shape, generator=g)).half().float())
            if name.endswith("act_fn.beta"):              # apertus's xIELU beta: 0.5 at init; one per layer here
                b.copy_((0.3 + 0.4 * torch.rand(b.shape, generator=g)).half().float())


def convert(model_dir: Path, out: Path, llamacpp: Path, raw_config: bool = False, no_mtp: bool = False,
            extra: str = "") -> None:
    """llama.cpp's convert_hf_to_gguf.py with its own gguf-py, in a child process. raw_config: the
    converter reads config.json as written (what its load_hparams falls back to where transformers
    does not know the model type) instead of transformers' AutoConfig.to_dict()."""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(llamacpp)!r}, {str(llamacpp / 'gguf-py')!r}]\n"
        "import conversion.base as base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        + ("import json\n"
           "base.ModelBase.load_hparams = staticmethod(lambda d, is_mistral_format=False: json.loads((d / 'config.json').read_text()))\n"
           if raw_config else "") +
        # Gemma2Model reads a sentencepiece tokenizer.model only; ours is a byte-level BPE
        "import conversion.gemma as gemma\n"
        "gemma.Gemma2Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        "gemma.GemmaModel.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        "gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        # HunYuanMoEModel.set_vocab reads a tiktoken tokenizer's mergeable_ranks only
        "import conversion.hunyuan as hunyuan\n"
        "hunyuan.HunYuanMoEModel.set_vocab = lambda self: self._set_vocab_gpt2()\n"
        # StableLMModel.modify_tensors `return`s the stacked per-head q/k norms (_stack_qk_norm's generator) from
        # inside a generator, which drops it ("Unprocessed norms" for StableLM 2 12B): yield it, as meant
        "import conversion.stablelm as stablelm\n"
        "_slm_mt = stablelm.StableLMModel.modify_tensors\n"
        "def _slm_fixed(self, *a):\n"
        "    r = yield from _slm_mt(self, *a)\n"
        "    if r is not None:\n"
        "        yield from r\n"
        "stablelm.StableLMModel.modify_tensors = _slm_fixed\n"
        + extra +   # a fixture's own converter patch (bitnet_fixture.CONVERT_CODE)
        "import convert_hf_to_gguf as c\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(model_dir)!r}, '--outfile', {str(out)!r}, '--outtype', 'f16']" + (" + ['--no-mtp']" if no_mtp else "") + "\n"
        "c.main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=llamacpp)
    if r.returncode:
        raise SystemExit(f"conversion of {model_dir} failed:\n{r.stderr[-4000:]}")


def phimoe_llamacpp_rules(model) -> None:
    """Phi-3.5-MoE as llama.cpp computes it (src/models/phi3.cpp, which phimoe's graph is): each
    nn.LayerNorm as RMSNorm * weight + bias (LLM_NORM_RMS with the bias), the router as softmax top-k
    renormalized (build_moe_ffn norm_w = true), not HF's LayerNorm and sparsemixer."""
    import torch

    def rms_bias(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias

    def softmax_topk(self, h):
        logits = torch.nn.functional.linear(h, self.weight)
        w, idx = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        return logits, w / w.sum(-1, keepdim=True), idx

    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.forward = rms_bias.__get__(mod)
        if type(mod).__name__ == "PhimoeTopKRouter":
            mod.forward = softmax_topk.__get__(mod)


def shared_head_norms(model) -> None:
    """Chameleon: HF's ChameleonLayerNorm holds a q/k norm weight and bias per head, (H, Dh), but llama.cpp's
    converter (conversion/chameleon.py ChameleonModel.modify_tensors / _reverse_hf_permute) keeps row 0 only,
    reorders it for NORM rope and repeats it for every head (the released checkpoints' norms are one row repeated:
    transformers' convert_chameleon_weights_to_hf.py repeat_interleaves it). randomize() draws a different row per
    head, which the converted file would not hold: every head's row is set to one random row (weight around 1,
    bias around 0, float16-exact) before the reference is computed."""
    import torch

    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                dh = norm.weight.shape[-1]
                w = (1.0 + 0.3 * torch.randn(dh, generator=gen)).half().float()
                b = (0.3 * torch.randn(dh, generator=gen)).half().float()
                norm.weight.copy_(w.expand_as(norm.weight))
                norm.bias.copy_(b.expand_as(norm.bias))


# transformers' modules swapped for llama.cpp's rules before the reference is computed
LLAMACPP_RULES = {"phimoe": phimoe_llamacpp_rules, "chameleon": shared_head_norms, "chameleon-swin": shared_head_norms}
# the released Phi-3.5-MoE names its class PhiMoEForCausalLM (llama.cpp's converter registers that spelling)
CONFIG_AS_RELEASED |= {"mpt": lambda c: {**c, "architectures": ["MPTForCausalLM"]}}   # conversion/mpt.py
CONFIG_AS_RELEASED |= {"phimoe": lambda c: {**c, "architectures": ["PhiMoEForCausalLM"]}}


def nope_layers(c: dict) -> dict:
    """GraniteSWAConfig (transformers 5.25) marks a rope-less layer by layer_rope_theta 0; llama.cpp's converter
    (conversion/granite.py GraniteSWAModel) writes attention.rope_pattern from no_rope_layers (1 = rope) only:
    the same layers, in the key it reads."""
    return {**c, "no_rope_layers": [int(bool(t)) for t in c["layer_rope_theta"]]}


CONFIG_AS_RELEASED |= {"granite_swa": nope_layers}
# transformers 5.25 saves InternLM3 as LlamaForCausalLM; the released config.json names InternLM3ForCausalLM, which
# llama.cpp's converter registers (conversion/internlm.py); its vocabulary is read from tokenizer.model only
CONFIG_AS_RELEASED |= {n: (lambda c: {**c, "architectures": ["InternLM3ForCausalLM"]}) for n in ("internlm3", "internlm3-bias")}
SPM |= {"internlm3", "internlm3-bias"}
CENTERED_BIAS |= {"internlm3-bias"}


def mimo_v2_as_released(c: dict) -> dict:
    """MiMoV2FlashConfig (transformers 5.25) saves layer_types and a rope_parameters entry per layer type; the released
    config.json (XiaomiMiMo/MiMo-V2-Flash), which llama.cpp's converter (conversion/mimo.py MimoV2Model) reads, has
    hybrid_layer_pattern (1 = sliding), the swa_* head geometry (SWA layers: twice the kv heads, as HF's attention
    builds them), topk_method, layernorm_epsilon and rope_theta / swa_rope_theta / partial_rotary_factor."""
    rp = c.pop("rope_parameters")
    full, swa = rp["full_attention"], rp["sliding_attention"]
    assert full.get("partial_rotary_factor") == swa.get("partial_rotary_factor")
    return {**c, "hybrid_layer_pattern": [int(t == "sliding_attention") for t in c.pop("layer_types")],
            "moe_layer_freq": [int(t == "sparse") for t in c["mlp_layer_types"]],
            "swa_head_dim": c["head_dim"], "swa_num_attention_heads": c["num_attention_heads"],
            "swa_v_head_dim": c["v_head_dim"], "swa_num_key_value_heads": 2 * c["num_key_value_heads"],
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "layernorm_epsilon": c["rms_norm_eps"],
            "rope_theta": full["rope_theta"], "swa_rope_theta": swa["rope_theta"],
            "partial_rotary_factor": full["partial_rotary_factor"]}


CONFIG_AS_RELEASED |= {"mimo_v2_flash": mimo_v2_as_released}
# llama.cpp's converter takes Mistral 4 under Ministral3ForCausalLM / Mistral3ForConditionalGeneration only
# (conversion/mistral3.py: Mistral3Model picks its Mistral4Model impl by model_type "mistral4"); the text model's
# config.json as written, under the registered class name
CONFIG_AS_RELEASED |= {"mistral4": lambda c: {**c, "architectures": ["Ministral3ForCausalLM"]}}


def reference(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def build(name: str, llamacpp: Path, seed: int) -> None:
    import torch
    import transformers

    cfg_name, cls_name, kw = ARCHS[name]
    torch.manual_seed(seed)
    if "text_config" in kw:      # a vision-language model: the vocabulary is the text model's
        kw = {**kw, "text_config": {**kw["text_config"], "vocab_size": VOCAB}}
        cfg = getattr(transformers, cfg_name)(**kw)
    else:
        cfg = getattr(transformers, cfg_name)(vocab_size=VOCAB, **kw)
    model = getattr(transformers, cls_name)(cfg).float().eval()
    randomize(model, seed, centered_bias=name in CENTERED_BIAS)
    if name in LLAMACPP_RULES:
        LLAMACPP_RULES[name](model)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        model.save_pretrained(d, safe_serialization=True)
        make_tokenizer(d, EXTRA_SPECIALS.get(name, ()))
        if name in SPM:
            make_spm_tokenizer(d)
        if name.startswith(("phi3", "phimoe")):   # llama.cpp's Phi3 converter takes a byte-level BPE only under this class name
            tc = json.loads((d / "tokenizer_config.json").read_text())
            tc["tokenizer_class"] = "GPT2Tokenizer"
            (d / "tokenizer_config.json").write_text(json.dumps(tc))
        if name in LAYER_TYPES_AS_RELEASED:
            c = json.loads((d / "config.json").read_text())
            names = {"linear_attention": "mamba", "full_attention": "attention"}
            c["layer_types"] = [names.get(t, t) for t in c["layer_types"]]
            (d / "config.json").write_text(json.dumps(c))
        if name in CONFIG_AS_RELEASED:
            c = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps(CONFIG_AS_RELEASED[name](c)))
        if name in EXPERTS_AS_RELEASED:
            experts_as_released(d)
        if name in DENSE_MLP_AS_RELEASED:
            dense_mlp_as_released(d)
        if name in bitnet_fixture.NAMES:
            bitnet_fixture.as_released(d, name)
        convert(d, OUT / f"{name}.gguf", llamacpp, raw_config=name in CONFIG_AS_RELEASED,
                no_mtp=name in NO_MTP, extra=bitnet_fixture.CONVERT_CODE.get(name, ""))
    if name in bitnet_fixture.NAMES:     # the reference runs on the converter's ternary weights
        bitnet_fixture.weights_as_converted(model, OUT / f"{name}.gguf", llamacpp)

    rng = np.random.default_rng(seed)
    seq_len = 24 if name.startswith(LONGROPE) else SEQ   # phi3: inside the original context (short factors)
    ids = rng.integers(3, VOCAB, size=seq_len).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(model, ids)}
    if name.startswith(LONGROPE):  # past original_max_position_embeddings: transformers switches to long factors
        ids_long = rng.integers(3, VOCAB, size=48).tolist()
        arrays["ids_long"] = np.array(ids_long, dtype=np.int64)
        arrays["logits_long"] = reference(model, ids_long)
    if name == "starcoder2":   # the same weights with a window of 8 (HF reads config.sliding_window per call)
        model.config.sliding_window = 8
        arrays["logits_window8"] = reference(model, ids)
        model.config.sliding_window = None
    prompt = ids[:PROMPT]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                             pad_token_id=0, eos_token_id=None)
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = out[0, PROMPT:].numpy().astype(np.int64)
    if name == "llama4":   # chunk 8 and temperature floor 4 (released: 8192 both, llama.cpp's constants)
        model.config.attention_chunk_size = 8
        for layer in model.model.layers:
            layer.self_attn.floor_scale = 4
        arrays["logits_local"] = reference(model, ids)
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                 pad_token_id=0, eos_token_id=None)
        arrays["greedy_local"] = out[0, PROMPT:].numpy().astype(np.int64)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    (OUT / f"{name}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": cls_name, "seed": seed,
        "config": json.loads(cfg.to_json_string())}, indent=1, sort_keys=True) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{name}: {(OUT / f'{name}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 logit gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp", required=True, type=Path,
                    help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    ap.add_argument("--only", nargs="*", choices=sorted(ARCHS), help="some architectures only")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in a.only or ARCHS:
        build(name, a.llamacpp.resolve(), a.seed)


if __name__ == "__main__":
    main()
