"""The new architectures on the GPU: the CUDA engine against the CPU reference engine and against
transformers, on the committed fixtures of tests/data/arch/ (tools/gen_arch_fixtures.py: tiny
random HF models converted by llama.cpp's convert_hf_to_gguf.py, F16 weights).

- act_dtype float32: every position's logits within 1e-3 of transformers, greedy identical.
- the default bf16 against the CPU engine's float32 reference (MINFER_CPU_QUANT=0), prefill and
  decode steps, by tests/gpu/test_model_gpu.py's criterion ||gpu - cpu|| / ||cpu|| < 1e-2 (see
  BF16_TOL for when a fixture's own bf16 rounding floor raises it), every MoE layer's expert choices
  pinned to the float32 run's (route_pins.py), and the launch paths say the architecture's own
  kernels ran (window attention, GELU, MoE).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from route_pins import RoutePins  # noqa: E402

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
ARCHS = ["qwen3", "llama3", "mistral", "gemma", "gemma3", "phi2", "phi3", "phi3partial", "qwen3moe", "qwen2moe", "gemma2", "olmo2", "granite", "smollm3", "granitemoe", "granitemoeshared", "ernie4_5", "glm4",
         "glm4moe", "olmo3", "gpt-oss", "command-r", "command-r-qknorm", "cohere2", "deepseek2", "deepseek3",
         "mistral3", "seed_oss", "exaone4", "gemma4", "gemma4-ple", "gemma4-moe", "gemma3n", "lfm2", "lfm2moe", "llama4", "mamba", "falcon-mamba", "mamba2", "jamba",
         "qwen2vl", "qwen3vl", "qwen3vlmoe", "ernie4_5-moe", "ernie4_5-moe-step2", "exaone", "olmoe", "starcoder2", "hunyuan-dense", "qwen35", "qwen35moe", "qwen3next", "granitehybrid", "granitehybrid-dense",
         "arcee", "apertus", "dots1", "hunyuan-moe", "minimax-m2",
         "falcon", "falcon-40b", "falcon-11b", "starcoder", "gptneox", "gptneox-seq", "gpt2", "bloom", "mpt",
         "nemotron_h", "falcon-h1", "falcon-h1-nonorm", "nemotron_h_moe", "nemotron_h_moe-latent", "olmo",
         "stablelm", "stablelm-12b", "nemotron", "nemotron-bias", "phimoe", "dbrx", "exaone-moe", "minicpm3", "afmoe", "jais2",
         "cohere2moe", "cohere2moe-ln",
         "granite_swa", "granitemoe_swa",
         "internlm3", "internlm3-bias", "internlm2", "baichuan",
         "olmo3-yarn",
         "hy_v3", "mellum", "mimo_v2_flash", "laguna", "laguna-elem", "laguna-yarn",
         "mellum-yarn",
         "bitnet", "bitnet-silu",
         "mistral4", "chatglm", "mixtral",
         "glm4moe-lite", "solar-open", "kimi-linear",
         "chameleon", "chameleon-swin",
         "muse-glimmer", "hrm-text", "gptj", "minicpm", "deci", "bailingmoe2", "smallthinker", "nanbeige", "maincoder", "bailingmoe",
         "pangu-embedded", "deepseek", "grovemoe", "xverse", "orion", "codeshell", "openelm", "refact",
         "plamo", "arctic", "grok", "grok2", "jais"]
CTX = {"phi3": 32, "phi3partial": 32}
CTX |= {"minicpm3": 32}   # LongRoPE: inside the original context, as transformers' reference
# the Mamba-2 mixer's paths: the prefill's conv and chunked scan in torch ops, the decode step (in the graph
# too) in ops/cuda/ssm_step.py's kernel, the gate and group norm in its norm kernel
SSM = ["ssm.conv.torch", "ssm.scan.torch", "ssm.step.triton", "ssm.norm.triton"]
SSM1 = ["ssm1.conv.torch", "ssm1.scan.torch", "ssm1.conv.triton", "ssm1.scan.triton"]
DELTANET = ["deltanet.conv.torch", "deltanet.scan.torch", "deltanet.step.triton"]
# the launch paths each architecture must show on the GPU
MUST_RUN = {"gemma": ["geglu.triton", "attention.decode"], "phi2": ["layer_norm.triton", "attention.decode"], "gemma3": ["attention.window", "geglu.triton"], "qwen3moe": ["moe.gather", "moe.grouped"],
            "glm4moe": ["moe.gather", "moe.grouped"],   # sigmoid gating, selection bias, groups, scale
            "granitemoe": ["moe.gather", "moe.grouped"], "granitemoeshared": ["moe.gather", "moe.grouped"],
            "gemma2": ["attention.softcap.torch", "attention.softcap.window.decode", "attention.softcap.decode",
                       "geglu.triton"],
            "olmo3": ["attention.window"],
            # command-r / cohere2: the LayerNorm kernel (q/k norms too), cohere2's window layers and its
            # rope-less global layer
            "command-r": ["layer_norm.triton"], "command-r-qknorm": ["layer_norm.triton"],
            "cohere2": ["layer_norm.triton", "attention.window", "attention.decode"],
            # gpt-oss: the sinks (T > 1 in torch, the decode kernel's SINK variant on window and full
            # layers) and the MoE's options (moe_act.py's biased clamped SwiGLU on both MoE paths)
            "gpt-oss": ["attention.sinks.torch", "attention.window.decode", "attention.decode.triton",
                        "moe.gather", "moe.grouped", "moe.act.triton"],
            # deepseek2: the latent attention (K of kv_lora + rope dims, V its first kv_lora) on the torch
            # path at T > 1, attention_mla.py's kernel at T = 1, the MoE (softmax / sigmoid + selection
            # bias + groups + scale) on both paths
            "deepseek2": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "moe.grouped"],
            "deepseek3": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "moe.grouped"],
            # mistral3: YaRN's divisors and the per-position temperature (prefill of 30 > its original 16);
            # exaone4: window layers with rope, the rope-less global layer
            "mistral3": ["rope", "attention.decode"], "seed_oss": ["attention.decode"],
            "exaone4": ["attention.window", "attention.decode"],
            # gemma4: window and global layers of different head sizes and kv heads in one padded cache,
            # proportional rope factors (rope_freqs 1e30), scale 1, GELU
            "gemma4": ["attention.window", "attention.decode", "geglu.triton"],
            # gemma4-ple: per-layer embeddings (the per-layer table's gather, its GELU gate), shared-KV layers
            # reading earlier layers' caches, double-wide MLPs
            "gemma4-ple": ["attention.window", "attention.decode", "geglu.triton"],
            # gemma4-moe: the MLP and the experts side by side, the experts' GELU (moe_act.py) over the fused
            # gate_up tensor, the router on its own input, on both MoE paths
            "gemma4-moe": ["attention.window", "attention.decode", "geglu.triton", "moe.gather", "moe.grouped",
                           "moe.act.triton"],
            # gemma3n: gemma4-ple's attention, per-layer embeddings and shared-KV layers around AltUp's streams
            # (float32 torch matmuls), LAuReL, the sparsified GELU gate on layers 0 and 1
            "gemma3n": ["attention.window", "attention.decode", "geglu.triton"],
            # lfm2: the conv layers' B*x rows in the per-layer cache (torch ops, in the decode graph too), the
            # attention layers' per-head q/k norms
            "lfm2": ["shortconv.torch", "attention.decode"],
            # lfm2moe: lfm2's layers, the sigmoid / biased MoE on both paths
            "lfm2moe": ["shortconv.torch", "attention.decode", "moe.gather", "moe.grouped"],
            # llama4: rope layers with the weightless q/k norms and chunks (the graphed decode's chunked layers by
            # the decode kernel's CHUNK variant), the NoPE layer, the top-1 MoE
            "llama4": ["rope", "attention.decode", "attention.chunked.decode", "moe.gather", "moe.grouped"],
            # mamba2: the Mamba-2 mixer alone (prefill: conv ring and scan in torch ops; the decode step, in the
            # graph too: ops/cuda/ssm_step.py's kernel; the gate and group norm: its norm kernel)
            "mamba2": SSM,
            # mamba / falcon-mamba: the Mamba-1 mixer alone (prefill: conv ring and selective scan in torch ops; the
            # decode step, in the graph too: ops/cuda/ssm1_step.py's conv and scan kernels)
            "mamba": SSM1, "falcon-mamba": SSM1,
            # jamba: the Mamba-1 mixer on its layers, rope-less attention, the MoE on both paths
            "jamba": [*SSM1, "attention.decode", "moe.gather", "moe.grouped"],
            # olmoe: whole-projection q/k norms, the MoE (softmax top-k, no renormalization) on both paths;
            # starcoder2: LayerNorm with bias (the kernel, then + bias), biases on every linear
            "olmoe": ["attention.decode", "moe.gather", "moe.grouped"],
            # qwen3vlmoe: qwen3moe's MoE (softmax top-k, renormalized) on both paths
            "qwen3vlmoe": ["attention.decode", "moe.gather", "moe.grouped"],
            # ernie4_5-moe: the softmax MoE chosen with the selection bias, shared experts, dense layers between
            "ernie4_5-moe": ["attention.decode", "moe.gather", "moe.grouped"],
            "ernie4_5-moe-step2": ["attention.decode", "moe.gather", "moe.grouped"],
            # exaone: NEOX rope with the Llama-3 frequency divisors
            "exaone": ["rope", "attention.decode"],
            "starcoder2": ["layer_norm.triton", "attention.decode"],
            # falcon: LayerNorm with bias, the fused q/k/v split, NEOX rope (-40b: the second LayerNorm, grouped kv)
            "falcon": ["layer_norm.triton", "rope", "attention.decode"],
            "falcon-40b": ["layer_norm.triton", "rope", "attention.decode"],
            "falcon-11b": ["layer_norm.triton", "rope", "attention.decode"],
            # starcoder: learned positions, no rope, LayerNorm with bias, biases on every linear
            "starcoder": ["layer_norm.triton", "attention.decode"],
            # gptneox: partial NEOX rope, LayerNorm with bias, parallel / sequential residual; gpt2: learned positions
            "gptneox": ["layer_norm.triton", "rope", "attention.decode"],
            "gptneox-seq": ["layer_norm.triton", "rope", "attention.decode"],
            "gpt2": ["layer_norm.triton", "attention.decode"],
            # bloom: ALiBi in the counted torch path (prefill and decode), the embedding LayerNorm
            "bloom": ["layer_norm.triton", "attention.alibi.torch"],
            "mpt": ["layer_norm.triton", "attention.alibi.torch"],
            # hunyuan-dense: the per-head q/k norms after rope (rope kernel, norm, then the cache write)
            "hunyuan-dense": ["rope", "attention.decode"],
            # arcee: YaRN's divisors through the rope kernel, the squared-ReLU MLP (torch ops)
            "arcee": ["rope", "attention.decode", "relu2.torch"],
            # apertus: per-head q/k norms before rope, the per-layer xIELU MLP (torch ops)
            "apertus": ["rope", "attention.decode", "xielu.torch"],
            # dots1: sigmoid scores, groups, selection bias, scale and the shared expert on both MoE paths
            "dots1": ["attention.decode", "moe.gather", "moe.grouped"],
            # hunyuan-moe: q/k norms after the rope kernel, the softmax MoE and the shared expert on both paths
            "hunyuan-moe": ["rope", "attention.decode", "moe.gather", "moe.grouped"],
            # minimax-m2: whole-projection q/k norms, partial rope, the sigmoid MoE with its selection bias
            "minimax-m2": ["attention.decode", "moe.gather", "moe.grouped"],
            # qwen35: the DeltaNet layers' conv ring and delta-rule scan (prefill: torch ops; decode, in the graph
            # too: the deltanet_step kernel; the state rings are indexed by position), the gated full-attention layer
            "qwen35": [*DELTANET, "attention.decode"],
            "qwen35moe": [*DELTANET, "attention.decode", "moe.gather", "moe.grouped"],
            "qwen3next": [*DELTANET, "attention.decode", "moe.gather", "moe.grouped"],
            # granitehybrid: the Mamba-2 layers' conv ring and scan (prefill: torch ops; decode, in the graph too:
            # the ssm_step kernel; the state rings are indexed by position, so the graph's warm-up runs repeat a
            # step harmlessly), the rope-less
            # attention layer, the MoE on both paths (-dense: the shared MLP alone)
            "granitehybrid": [*SSM, "attention.decode", "moe.gather", "moe.grouped"],
            "granitehybrid-dense": [*SSM, "attention.decode"],
            # nemotron_h: Mamba-2 blocks, squared-ReLU MLP blocks (torch ops), a rope-less attention block
            "nemotron_h": [*SSM, "relu2.torch", "attention.decode"],
            # falcon-h1: attention (NEOX rope) and Mamba-2 side by side in every layer
            "falcon-h1": [*SSM, "rope", "attention.decode"],
            "falcon-h1-nonorm": [*SSM, "rope", "attention.decode"],
            # nemotron_h_moe: Mamba-2 and rope-less attention blocks, MoE blocks of ungated squared-ReLU experts
            # (moe_act.py's relu2 on both MoE paths) plus the squared-ReLU shared expert (torch ops); -latent: the
            # experts between the latent projections
            "nemotron_h_moe": [*SSM, "attention.decode", "moe.gather", "moe.grouped",
                               "moe.act.triton", "relu2.torch"],
            "nemotron_h_moe-latent": [*SSM, "attention.decode", "moe.gather",
                                      "moe.grouped", "moe.act.triton", "relu2.torch"],
            # olmo: weightless LayerNorms (the kernel with a weight of ones), the clamped q/k/v through rope
            "olmo": ["layer_norm.triton", "rope", "attention.decode"],
            # stablelm: LayerNorms with bias, partial NEOX rope; -12b: per-head q/k LayerNorms, parallel residual
            "stablelm": ["layer_norm.triton", "rope", "attention.decode"],
            "stablelm-12b": ["layer_norm.triton", "rope", "attention.decode"],
            # nemotron: LayerNorms with bias, partial NEOX rope, the squared-ReLU MLP (torch ops); -bias: every bias
            "nemotron": ["layer_norm.triton", "rope", "attention.decode", "relu2.torch"],
            "nemotron-bias": ["layer_norm.triton", "rope", "attention.decode", "relu2.torch"],
            # phimoe: RMSNorm plus bias, biases, the softmax top-2 renormalized MoE on both paths
            "phimoe": ["rope", "attention.decode", "moe.gather", "moe.grouped"],
            # dbrx: LayerNorms without bias, the clamped fused q/k/v, the softmax top-2 renormalized MoE on both paths
            "dbrx": ["layer_norm.triton", "rope", "attention.decode", "moe.gather", "moe.grouped"],
            # exaone-moe: window layers with rope, rope-less global layers, the sigmoid / grouped / biased MoE
            # with the shared expert on both paths
            "exaone-moe": ["attention.window", "attention.decode", "moe.gather", "moe.grouped"],
            # minicpm3: the latent attention with q_lora (torch prefill, the MLA decode kernel), LongRoPE
            "minicpm3": ["attention.mla.torch", "attention.mla.decode.triton", "rope"],
            # afmoe: window layers with rope, a rope-less global layer, the gated attention output, post norms,
            # the sigmoid / biased MoE with the shared expert on both paths
            "afmoe": ["attention.window", "attention.decode", "moe.gather", "moe.grouped"],
            # jais2: LayerNorms with bias, NEOX rope, every bias, the squared-ReLU MLP (torch ops)
            "jais2": ["layer_norm.triton", "rope", "attention.decode", "relu2.torch"],
            # cohere2moe: the parallel block around the window / dense-prefix / rope-less global attention and the
            # sigmoid MoE with its averaged shared expert (RMSNorm); -ln: LayerNorm and the softmax MoE
            "cohere2moe": ["rms_norm.triton", "attention.window", "attention.decode", "moe.gather", "moe.grouped"],
            "cohere2moe-ln": ["layer_norm.triton", "attention.window", "attention.decode", "moe.gather",
                              "moe.grouped"],
            # granite_swa: the sinks (T > 1 in torch, the decode kernel's SINK variant on window and full layers), a
            # rope-less layer; granitemoe_swa: the softmax MoE over fused gate/up experts on both MoE paths
            "granite_swa": ["attention.sinks.torch", "attention.window.decode", "attention.decode.triton"],
            "granitemoe_swa": ["attention.sinks.torch", "attention.window.decode", "attention.decode.triton",
                               "moe.gather", "moe.grouped"],
            # internlm3: the llama graph as converted; -bias: q/k/v, o and MLP biases (models/llama_bias.py)
            "internlm3": ["rope", "attention.decode"], "internlm3-bias": ["rope", "attention.decode"],
            # olmo3-yarn: the window layers' plain rope, the global layer's YaRN divisors and mscale^2
            "olmo3-yarn": ["attention.window", "attention.decode"],
            # hy_v3 (dots1's paths): q/k norms before rope, a dense layer, the sigmoid / biased MoE with the shared
            # expert on both MoE paths
            "hy_v3": ["attention.decode", "moe.gather", "moe.grouped"],
            # mellum: window layers with the SWA rope base, a full layer, the softmax MoE on both paths
            "mellum": ["attention.window", "attention.decode", "moe.gather", "moe.grouped"],
            # mimo_v2_flash: per-layer kv heads, V padded to K's width, the sinks on the window layers (torch for T > 1,
            # the window decode kernel's SINK variant), partial rope, the sigmoid / biased MoE on both paths
            "mimo_v2_flash": ["attention.sinks.torch", "attention.window.decode", "attention.decode", "moe.gather",
                              "moe.grouped"],
            # laguna: per-layer query heads, the window layers' own rope, the softplus gate per head (-elem: per
            # element, no window), the sigmoid / biased MoE with the shared expert on both paths
            "laguna": ["attention.window", "attention.decode", "moe.gather", "moe.grouped"],
            "laguna-elem": ["attention.decode", "moe.gather", "moe.grouped"],
            # laguna-yarn: the full layer's YaRN divisors and mscale^2 on q's rotated dims, the window layers unscaled
            "laguna-yarn": ["attention.window", "attention.decode", "moe.gather"],
            # mellum-yarn: the full layer's YaRN divisors and mscale^2, the window layers unscaled
            "mellum-yarn": ["attention.window", "attention.decode", "moe.gather"],
            # mistral4: the latent attention with q_lora and YaRN (torch prefill, the MLA decode kernel), the grouped
            # softmax MoE on the fused gate_up experts with the shared expert on both paths
            "mistral4": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "moe.grouped"],
            # bitnet: the sub-norms (rms_norm.triton), the squared-ReLU gate in torch (relu2.torch), NEOX rope and the
            # decode kernel; bitnet-silu: the same with the SiLU gate (swiglu.triton: F 96 takes no int8 rows)
            "bitnet": ["relu2.torch", "rms_norm.triton", "attention.decode"],
            "bitnet-silu": ["swiglu.triton", "rms_norm.triton", "attention.decode"],
            # mixtral: a llama file with experts (models/llama_moe.py), the softmax top-2 renormalized MoE on both paths
            "mixtral": ["attention.decode", "moe.gather", "moe.grouped"],
            # kimi-linear: the KDA layers' torch path (per-channel decay: no kernel; kda.py), the MLA layers' latent
            # attention with V in K (torch prefill, the MLA decode kernel), the sigmoid / biased MoE on both paths
            "kimi-linear": ["kda.conv.torch", "kda.scan.torch", "attention.mla.torch", "attention.mla.decode.triton",
                            "moe.gather", "moe.grouped"],
            # glm4moe-lite (GLM-4.7-Flash as deepseek2): the latent attention with q_lora, unscaled rope (torch prefill,
            # the MLA decode kernel), the sigmoid / biased MoE scaled by 1.8 with the shared expert on both paths
            "glm4moe-lite": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "moe.grouped"],
            # solar-open (glm4moe): YaRN's divisors on the full head and q * c^2 (rope_and_write, then the decode
            # kernel), every layer the sigmoid / biased MoE with the shared expert on both paths
            "solar-open": ["rope", "attention.decode", "moe.gather", "moe.grouped"],
            # muse-glimmer: the weight-less embedding norm and the post-norms (rms_norm.triton), NORM rope on the
            # window layers only, rope-less global layers, the sigmoid-gated attention output
            "muse-glimmer": ["rms_norm.triton", "attention.window", "attention.decode"],
            # hrm-text: the weight-less norms (add_rms_norm, a ones weight), the SwiGLU MLP, the decode kernel over
            # the 12 cache slots of 4 weight blocks
            "hrm-text": ["add_rms_norm", "swiglu", "attention.decode"]}

# chameleon: the per-head q/k LayerNorms with bias (layer_norm.triton), NORM rope, the decode kernel; chameleon-swin:
# the branch outputs' RMSNorms (swin_norm) too
MUST_RUN |= {"internlm2": ["rope", "attention.decode"]}   # the llama graph on the converter's split wqkv, GQA 2:1
MUST_RUN |= {"baichuan": ["rope", "attention.decode"]}    # the llama graph on the converter's split W_pack, 32 layers
MUST_RUN |= {"minicpm": ["rope", "attention.decode"]}   # granite's scaled graph, GQA 2:1, NORM rope
MUST_RUN |= {"bailingmoe2": ["rope", "attention.decode", "moe.gather", "moe.grouped"]}   # sigmoid + expert bias, groups, shared expert
MUST_RUN |= {"bailingmoe": ["rope", "attention.decode", "moe.gather", "moe.grouped"]}    # softmax top-k + shared expert
MUST_RUN |= {"pangu-embedded": ["rope", "attention.decode"]}   # q/k/v/o biases, NEOX rope on unpermuted rows, head 12 != D/H
MUST_RUN |= {"deepseek": ["rope", "attention.decode", "moe.gather", "moe.grouped"]}   # dense first layer, softmax top-k + shared
MUST_RUN |= {"grovemoe": ["rope", "attention.decode", "moe.gather", "moe.grouped"]}   # routed + chunk experts (2 moe_ffn calls)
MUST_RUN |= {"xverse": ["rope", "attention.decode"]}   # llama on the converter's permuted q/k, NORM rope
MUST_RUN |= {"orion": ["layer_norm.triton", "rope", "attention.decode"]}   # LayerNorms with bias, NEOX rope, GQA 2:1
MUST_RUN |= {"codeshell": ["layer_norm.triton", "rope", "attention.decode"]}   # fused q/k/v with bias, GQA 2:1, NEOX
MUST_RUN |= {"openelm": ["rope", "attention.decode"]}   # per-layer heads / FFN widths, fused qkv, q/k norm before NEOX
MUST_RUN |= {"refact": ["add_rms_norm", "swiglu", "attention.alibi.torch"]}   # ALiBi (no rope), MQA, RMSNorm + SwiGLU
MUST_RUN |= {"plamo": ["add_rms_norm", "swiglu", "rope", "attention.decode"]}   # parallel block, NEOX rope, GQA 3:1
MUST_RUN |= {"arctic": ["rope", "attention.decode", "moe.gather", "moe.grouped"]}   # residual MLP + parallel softmax top-k MoE
MUST_RUN |= {"grok": ["rope", "attention.softcap.torch", "attention.softcap.decode", "moe.gather", "moe.grouped"],
             "grok2": ["rope", "attention.softcap.torch", "attention.softcap.decode", "moe.gather", "moe.grouped",
                       "geglu.triton"]}   # soft-capped scores (no 1/sqrt(d)), GELU experts; grok2: dense GELU MLP
MUST_RUN |= {"jais": ["layer_norm.triton", "swiglu", "attention.alibi.torch"]}   # ALiBi with the 1/Dh scale
MUST_RUN |= {"smallthinker": ["rope", "attention.decode", "moe.gather", "moe.grouped", "moe.act.triton"]}   # router on the layer input, ReGLU experts
MUST_RUN |= {"nanbeige": ["rope", "attention.decode"]}    # looped llama layers (4 slots on 2 blocks), loop norm
MUST_RUN |= {"maincoder": ["rope", "attention.decode"]}   # NORM rope then per-head q/k RMSNorm, head_dim 24 != D/H
MUST_RUN |= {"gptj": ["layer_norm.triton", "rope", "attention.decode"]}   # parallel block, partial NORM rope
MUST_RUN |= {"chameleon": ["layer_norm.triton", "rope", "attention.decode"],
             "chameleon-swin": ["layer_norm.triton", "rms_norm.triton", "rope", "attention.decode"]}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """float32 against transformers: the largest, over positions, of max |got - ref| / max |ref|
    (tests/models/test_arch_vs_transformers.py's metric, so the GPU meets the CPU's bar)."""
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def rel(got, ref) -> float:
    """bf16 against the CPU: tests/gpu/test_model_gpu.py's rel, ||got - ref|| / ||ref|| over all
    the logits (float64)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# Why test_model_gpu's norm criterion and not a per-position max-abs one: bf16 keeps 8
# significant bits (unit roundoff 2**-8 = 0.0039), and each activation the GPU rounds (h, q, k,
# v, the attention output, every matmul output, the bf16 KV cache) adds noise of that order
# spread over every logit. A max over 320 logits and then over 30 positions picks the extreme
# tail of that noise (on these fixtures 1.7-2.3x the norm error), so the old per-row max-abs
# 2e-2 bar measured the tail of the format's noise, not the kernels; the norm over all the
# logits measures the noise's size, as the synthetic-model GPU test already does (1e-2).
#
# The tiny random fixtures (hidden 64, 2-4 layers, F16 weights, no trained structure that damps
# noise) are worse conditioned for bf16 than the synthetic models: the float32 reference itself,
# run with bf16 activations and a bf16 cache (the model classes allow it on the CPU; only the
# engine pins float32 there), lands 0.7-1.6% from its float32 run on the dense ones and 3-5% on
# the MoE ones (a bf16 router flips an expert choice now and then) -- measured on the CPU when
# this test was written. That floor is what the format costs this model whatever the kernels do,
# so the bar is test_model_gpu's 1e-2, raised to BF16_FACTOR times the fixture's measured floor (its largest
# over the prefill and decode steps) where the floor is above half of it. The GPU rounds at other
# points than the reference (fused kernels, cuDNN's bf16 probabilities), so its error is of the
# floor's order, not below it: on the H200 run that failed the old bar, qwen3/llama3/mistral's
# per-position max errors were 1.4-1.5x the bf16 reference's. A literal 1e-2 would fail the
# reference's own bf16 run on most of these fixtures. A wrong kernel is 10-100x the floor: the
# LongRoPE factor bug this file caught (phi3, cache rows read as the context) was 1.2-1.5.
# The factor is 2.5: on the 2026-12-05 H100 run (bench/results/raw/2026-12-05-s24/pytest-gpu.log, `bf16`
# lines) the 81 fixtures' ratios of the GPU's worst step to the floor ran 0.12-2.06, gemma4 the highest
# (2.06, twice in two runs), granitemoe 1.83, the rest <= 1.71; gemma4's float32 GPU run equals the CPU's
# (tools/bf16_diag.py: 0.0000 over every row) and its bf16 rows' median is 1.3x the CPU bf16 run's, so its
# worst step is where bf16 rounds, not a wrong rule. The routing flips this test now pins were 2.1-7x.
BF16_TOL = 1e-2
BF16_FACTOR = 2.5


def bf16_floor(name: str, prefill: list[int], decode: list[int], pins=None) -> list[float]:
    """rel(reference with bf16 activations, reference in float32) for the prefill and each
    following one-token decode step: the fixture's bf16 rounding floor. pins: (RoutePins, the
    float32 engine's choices per forward) -- both runs take those expert choices (route_pins.py)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.runtime.kv_cache import KVCache

    gf = GGUFFile(DATA / f"{name}.gguf")
    n_ctx = CTX.get(name, 64)
    runs = []
    for dt in (torch.float32, torch.bfloat16):
        m = load_model(gf, device="cpu", progress=False, act_dtype=dt)
        cache = KVCache.for_config(m.cfg, n_ctx, dtype=dt, context=n_ctx)
        n = len(prefill)
        with pinned(pins, n, "cpu") as load:
            load(0)
            outs = [m.forward(torch.tensor(prefill), Step.at(0, n, "cpu"), cache).float().numpy()]
            for i, tok in enumerate(decode):
                load(i + 1)
                outs.append(m.forward(torch.tensor([tok]), Step.at(n + i, 1, "cpu"), cache).float().numpy())
        runs.append(outs)
    return [rel(b, a) for a, b in zip(*runs)]


@contextlib.contextmanager
def pinned(pins, rows: int, device):
    """Inside: every route call takes the recorded float32 choices; yields load(step) to call
    before each forward (a no-op for a model without MoE)."""
    if pins is None:
        yield lambda step: None
        return
    rp, steps = pins
    k = {p.shape[1] for s in steps for p in s}
    assert len(k) == 1, k                   # one top-k per model (the pin buffer's width)
    with rp.pinning(len(steps[0]), rows, k.pop(), device):
        yield lambda step: rp.load(steps[step])


def split_ids(ids: list[int]) -> tuple[list[int], list[int]]:
    """The bf16 test's prefill and its four decode steps: 30 + 4 tokens, or fewer prefill tokens where the
    fixture has fewer ids (phi3, phi3partial and minicpm3 hold 24: their LongRoPE references stay inside the
    original context of 32), so every fixture's decode is stepped."""
    n = min(30, len(ids) - 4)
    assert n >= 8, (len(ids), "too few ids for a prefill and four decode steps")
    return ids[:n], ids[n:n + 4]


def float32_choices(cpu, ids: list[int]):
    """The CPU float32 engine's logits for the prefill and the four decode steps of split_ids(ids), and its
    MoE choices per forward ((RoutePins, [[(T, k) per call] per forward]); None without MoE)."""
    pre, dec = split_ids(ids)
    rp = RoutePins()
    with rp.recording():
        outs = [cpu.forward(pre, 0).numpy()]
        calls = len(rp.recorded)
        steps = [rp.take(calls)]
        for i, tok in enumerate(dec):
            outs.append(cpu.forward([tok], len(pre) + i).numpy())
            steps.append(rp.take(calls))
    return outs, ((rp, steps) if calls else None)


def bf16_tol(floor: float) -> float:
    return max(BF16_TOL, BF16_FACTOR * floor)


def engine(name, device, act_dtype=None, ctx=None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    import os

    # the CPU side is the float32 reference: the int8 CPU fast path (Switches.cpu_quant) off
    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(DATA / f"{name}.gguf", device=device, ctx=ctx or CTX.get(name, 64), progress=False,
                       switches=sw)


@pytest.mark.parametrize("name", ARCHS)
def test_arch_gpu_float32_matches_transformers(name):
    from minfer.runtime.sampling import SamplingParams

    r = np.load(DATA / f"{name}.npz")
    eng = engine(name, "cuda", act_dtype="float32")
    got = eng.logits(r["ids"].tolist()).numpy()
    assert rel_err(got, r["logits"]) < 1e-3
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                              max_new_tokens=len(r["greedy"]))]
    assert out == r["greedy"].tolist()


@pytest.mark.parametrize("name", ARCHS)
def test_arch_gpu_bf16_matches_cpu(name):
    """bf16 on the GPU against the CPU float32 engine, prefill and decode steps, every MoE layer's
    expert choices pinned to the float32 engine's (route_pins.py: an unpinned comparison of a
    near-tie measures where each side rounds, not the kernels)."""
    from minfer.ops import paths

    r = np.load(DATA / f"{name}.npz")
    ids = r["ids"].tolist()
    cpu = engine(name, "cpu")
    assert cpu.switches.cpu_quant is False
    ref, pins = float32_choices(cpu, ids)
    # one floor per fixture, the largest over the steps: a single step's floor is itself one
    # draw of the rounding noise (0.007-0.015 over qwen3's five), too noisy to scale alone
    pre, dec = split_ids(ids)
    floor = max(bf16_floor(name, pre, dec, pins))
    tol = bf16_tol(floor)
    gpu = engine(name, "cuda")
    paths.reset()
    errs = []
    with pinned(pins, len(pre), "cuda") as load:
        load(0)
        lg = gpu.forward(pre, 0).numpy()
        assert np.isfinite(lg).all()
        errs.append(rel(lg, ref[0]))
        for i, tok in enumerate(dec):              # decode steps (CUDA graphs) through the cache
            load(i + 1)
            errs.append(rel(gpu.forward([tok], len(pre) + i).numpy(), ref[i + 1]))
    assert len(errs) == 5                          # the prefill and four decode steps, on every fixture
    # one line per fixture (pytest -rP shows it): the GPU's worst step against the floor
    print(f"bf16 {name}: worst step {max(errs):.4f}, floor {floor:.4f}, ratio {max(errs) / floor:.2f}, tol {tol:.4f}")
    for i, e in enumerate(errs):                   # 0: the prefill, then the decode steps
        assert e < tol, (i, e, tol)
    if pins is not None:
        assert pins[0].pinned_calls + pins[0].unpinned >= 5 * len(pins[1][0])
    counts = paths.snapshot()["counts"]
    for p in MUST_RUN.get(name, []):
        assert any(k.startswith(p) for k in counts), (p, counts)


def test_phi3_gpu_long_factors():
    r = np.load(DATA / "phi3.npz")
    eng = engine("phi3", "cuda", act_dtype="float32", ctx=64)
    assert rel_err(eng.logits(r["ids_long"].tolist()).numpy(), r["logits_long"]) < 1e-3


def test_moe_gpu_paths_match_reference():
    """The MoE op alone: the expert gather (few rows) and the grouped matmul (many rows) against
    the reference's expert-by-expert loop, on the fixture's first layer."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import reference
    from minfer.ops.cuda import moe

    gf = GGUFFile(DATA / "qwen3moe.gguf")
    mc, mg = load_model(gf, device="cpu", progress=False), load_model(gf, device="cuda", progress=False)
    ec, eg = mc.moe[0], mg.moe[0]
    g = torch.Generator().manual_seed(0)
    for T in (1, 5, 200):
        h = torch.randn(T, mc.cfg.d_model, generator=g)
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            # the reference gets the same dtype-rounded input, so a router near-tie is decided on
            # the same numbers; bf16 is judged by the norm-relative error of test_model_gpu (the
            # H200 showed a per-element max error of 5.8% at T=200 in bf16: one flipped expert
            # choice moves whole rows, which the norm weighs by how many rows it is)
            hq = h.to(dt).float()
            ref = reference.moe_ffn(hq, ec.gate_inp, ec.gate_exps, ec.up_exps, ec.down_exps, 2, True)
            out = moe.moe_ffn(h.cuda().to(dt), eg.gate_inp, eg.gate_exps, eg.up_exps, eg.down_exps, 2, True)
            d = out.float().cpu() - ref
            err = float(d.abs().max() / ref.abs().max()) if dt == torch.float32 else float(d.norm() / ref.norm())
            assert err < tol, (T, dt, err)


def test_gpt_oss_moe_gpu_paths_match_reference():
    """ops.moe_ffn's gpt-oss options (router bias, softmax over the top-k logits, expert biases,
    clamped SwiGLU) on the GPU's gather and grouped paths against the reference, on the gpt-oss
    fixture's first layer (as test_moe_gpu_paths_match_reference)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import paths, reference
    from minfer.ops.cuda import moe

    gf = GGUFFile(DATA / "gpt-oss.gguf")
    mc, mg = load_model(gf, device="cpu", progress=False), load_model(gf, device="cuda", progress=False)
    k = mc.cfg.n_experts_used

    def opts(e):
        return dict(router_bias=e.router_bias, gating="topk_softmax", gate_bias=e.gate_bias, up_bias=e.up_bias,
                    down_bias=e.down_bias, act="swiglu_oai", alpha=1.702, limit=7.0)

    ec, eg = mc.moe[0], mg.moe[0]
    g = torch.Generator().manual_seed(0)
    paths.reset()
    for T in (1, 5, 200):
        h = 3 * torch.randn(T, mc.cfg.d_model, generator=g)      # large enough that the clamp acts
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            hq = h.to(dt).float()
            ref = reference.moe_ffn(hq, ec.router, ec.gate_exps, ec.up_exps, ec.down_exps, k, False, **opts(ec))
            out = moe.moe_ffn(h.cuda().to(dt), eg.router, eg.gate_exps, eg.up_exps, eg.down_exps, k, False, **opts(eg))
            d = out.float().cpu() - ref
            err = float(d.abs().max() / ref.abs().max()) if dt == torch.float32 else float(d.norm() / ref.norm())
            assert err < tol, (T, dt, err)
    assert paths.snapshot()["counts"].get("moe.act.triton") == 6


def test_gemma4_moe_gpu_paths_match_reference():
    """ops.moe_ffn's gemma4 options (GELU experts over the fused gate_up tensor, the router on its own
    input, the per-expert output scale) on the GPU's gather and grouped paths against the reference,
    on the gemma4-moe fixture's first layer (as test_gpt_oss_moe_gpu_paths_match_reference)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.ops import paths, reference
    from minfer.ops.cuda import moe

    gf = GGUFFile(DATA / "gemma4-moe.gguf")
    mc, mg = load_model(gf, device="cpu", progress=False), load_model(gf, device="cuda", progress=False)
    k = mc.cfg.n_experts_used
    ec, eg = mc.moe[0], mg.moe[0]
    g = torch.Generator().manual_seed(0)
    paths.reset()
    for T in (1, 5, 200):
        h = torch.randn(T, mc.cfg.d_model, generator=g)
        z = torch.randn(T, mc.cfg.d_model, generator=g)
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            hq = h.to(dt).float()
            ref = reference.moe_ffn(hq, ec.router, ec.gate_up_exps, None, ec.down_exps, k, True, act="geglu",
                                    router_in=z, down_scale=ec.down_scale)
            out = moe.moe_ffn(h.cuda().to(dt), eg.router, eg.gate_up_exps, None, eg.down_exps, k, True, act="geglu",
                              router_in=z.cuda(), down_scale=eg.down_scale)
            d = out.float().cpu() - ref
            err = float(d.abs().max() / ref.abs().max()) if dt == torch.float32 else float(d.norm() / ref.norm())
            assert err < tol, (T, dt, err)
    assert paths.snapshot()["counts"].get("moe.act.triton") == 6


def test_window_attention_gpu_matches_reference():
    """Sliding-window attention (prefill from 0, after a prefix, and decode) against the reference."""
    import importlib

    from minfer.ops import reference

    # the module, not the function of the same name that minfer.ops.cuda re-exports
    attention = importlib.import_module("minfer.ops.cuda.attention")
    g = torch.Generator().manual_seed(1)
    S, H, Hkv, D, W = 300, 4, 1, 64, 37
    k = torch.randn(S, Hkv, D, generator=g)
    v = torch.randn(S, Hkv, D, generator=g)
    for start, T in ((0, 200), (200, 60), (299, 1), (20, 1)):
        q = torch.randn(T, H, D, generator=g)
        ref = reference.attention(q, k, v, start, window=W)
        for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            out = attention.attention(q.cuda().to(dt), k.cuda().to(dt), v.cuda().to(dt), start, window=W)
            err = float((out.float().cpu() - ref).abs().max() / ref.abs().max())
            assert err < tol, (start, T, dt, err)


def test_softcap_attention_gpu_matches_reference():
    """Soft-capped scores (gemma2) on the GPU -- prefill from 0 and after a prefix (the torch
    float32 path), decode (the kernel's CAP variant), with and without a window -- against the
    reference; and the cap matters on these scores."""
    import importlib

    from minfer.ops import reference

    attention = importlib.import_module("minfer.ops.cuda.attention")
    g = torch.Generator().manual_seed(2)
    S, H, Hkv, D, W, cap = 300, 8, 2, 256, 37, 5.0     # gemma-2-2b's head geometry
    k = torch.randn(S, Hkv, D, generator=g)
    v = torch.randn(S, Hkv, D, generator=g)
    for start, T in ((0, 200), (200, 60), (299, 1), (20, 1)):
        q = 6 * torch.randn(T, H, D, generator=g)
        for window in (0, W):
            ref = reference.attention(q, k, v, start, window=window, softcap=cap)
            assert float((reference.attention(q, k, v, start, window=window) - ref).abs().max()) > 1e-2
            for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
                out = attention.attention(q.cuda().to(dt), k.cuda().to(dt), v.cuda().to(dt), start, window=window,
                                          softcap=cap)
                err = float((out.float().cpu() - ref).abs().max() / ref.abs().max())
                assert err < tol, (start, T, window, dt, err)
