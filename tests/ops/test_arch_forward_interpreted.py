"""The issue-16 architectures through the CUDA backend's code (Triton's interpreter, CPU tensors),
in the engine's Step modes -- eager prefill, the decode graph's host-free step, the padded
prefill graph's device-picked row (phi3) -- against the reference forward, on the committed
fixtures (tests/data/arch: llama.cpp-converted tiny HF models). This runs what the GPU runs for
these models (window attention prefill and decode, the GELU kernel, phi3's fused matrices and
partial rotary) without a GPU. fp32 activations (the interpreter's bf16 dot is wrong, ANCHORS.md).
The MoE grouped path and the masked window prefill are checked op by op in
test_arch_ops_interpreter.py (whole interpreted prefills took 50-80 s per model here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm", "minfer.ops.cuda.ssm_step", "minfer.ops.cuda.ssm1_step",
         "minfer.ops.cuda"]
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
# the Mamba-2 mixer's paths: the prefill's conv and chunked scan in torch ops, the one-token decode step in
# ops/cuda/ssm_step.py's kernel, the gate and group norm in its norm kernel
SSM = ["ssm.conv.torch", "ssm.scan.torch", "ssm.step.triton", "ssm.norm.triton"]
# the launch paths each model must take (beyond the common ones)
SSM1 = ["ssm1.conv.torch", "ssm1.scan.torch", "ssm1.conv.triton", "ssm1.scan.triton"]
MUST = {"gemma3": ["attention.window.decode", "geglu.triton"],
        # gemma: the scaled embedding, one kv head, the GELU kernel on the gate/up pair
        "gemma": ["geglu.triton", "rope.triton", "attention.decode.triton"],
        # phi2: the parallel block from one LayerNorm with bias, partial NEOX rope, biases, the lm head bias
        "phi2": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "phi3partial": ["rope.triton"], "qwen3moe": ["moe.gather"], "granitemoeshared": ["moe.gather"], "glm4moe": ["moe.gather", "moe.grouped", "rope.triton"],
        "olmo3": ["attention.window.decode"],
        "gemma2": ["attention.softcap.torch", "attention.softcap.window.decode", "attention.softcap.decode"],
        "command-r": ["layer_norm.triton"], "command-r-qknorm": ["layer_norm.triton"],
        "cohere2": ["layer_norm.triton", "attention.window.decode", "attention.decode.triton"],
        # deepseek2's latent attention (K of kv_lora + rope dims, V the first kv_lora): prefill on the torch
        # path, the decode step by attention_mla.py's kernel
        "deepseek2": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "rope.triton"],
        "deepseek3": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "rope.triton"],
        # glm4moe-lite (GLM-4.7-Flash as deepseek2): q_lora, unscaled rope, the sigmoid / biased MoE scaled by 1.8;
        # solar-open (glm4moe): YaRN's divisors on the full head through the rope kernel and q * c^2, every layer MoE
        "glm4moe-lite": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "rope.triton"],
        "solar-open": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"],
        # exaone4: window layers with rope, a rope-less global layer, per-head q/k norms, post-norms
        "exaone4": ["attention.window.decode", "attention.decode.triton"],
        # mistral3: YaRN's divisors through the rope kernel (the temperature past position 16:
        # tests/models/test_mistral3.py)
        "mistral3": ["rope.triton", "attention.decode.triton"], "seed_oss": ["rope.triton", "attention.decode.triton"],
        # starcoder2: LayerNorm with bias, the ungated GELU MLP, every linear with a bias
        "starcoder2": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        # falcon: LayerNorm with bias, the fused q/k/v matrix split, NEOX rope, the erf-GELU MLP in torch; -40b its
        # second LayerNorm (attn_norm_2) and grouped kv; -11b grouped kv with one LayerNorm
        "falcon": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "falcon-40b": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "falcon-11b": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        # starcoder: learned positions (the embedding kernel on the position table), no rope, LayerNorm with bias,
        # the fused q/k/v matrix with its bias, the GELU MLP in torch
        "starcoder": ["layer_norm.triton", "attention.decode.triton"],
        # gptneox: partial NEOX rope (a quarter / half of each head), LayerNorm with bias, parallel or sequential
        # residual; gpt2: learned positions, no rope (starcoder's graph with MHA)
        "gptneox": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "gptneox-seq": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "gpt2": ["layer_norm.triton", "attention.decode.triton"],
        # bloom: ALiBi (every attention step the counted torch path), the embedding LayerNorm, no rope
        "bloom": ["layer_norm.triton", "attention.alibi.torch"],
        # mpt: ALiBi, the clamped fused q/k/v, LayerNorms without bias
        "mpt": ["layer_norm.triton", "attention.alibi.torch"],
        # hunyuan-dense: the per-head q/k norms after rope (ops.rope, then the norm, then the cache write)
        "hunyuan-dense": ["rope.triton", "attention.decode.triton"],
        # arcee: YaRN's divisors through the rope kernel, q * c^2, the squared-ReLU MLP in torch
        "arcee": ["rope.triton", "attention.decode.triton", "relu2.torch"],
        # apertus: per-head q/k norms before the rope kernel, the per-layer xIELU MLP in torch
        "apertus": ["rope.triton", "attention.decode.triton", "xielu.torch"],
        # dots1: per-head q/k norms, a dense layer, then the sigmoid / grouped / biased MoE with the shared expert
        "dots1": ["moe.gather", "moe.grouped", "rope.triton"],
        # hunyuan-moe: per-head q/k norms after rope, the softmax MoE plus the ungated shared expert
        "hunyuan-moe": ["moe.gather", "moe.grouped", "rope.triton"],
        # minimax-m2: whole-projection q/k norms, partial NEOX rope, the sigmoid MoE with its selection bias
        "minimax-m2": ["moe.gather", "moe.grouped", "rope.triton"],
        # olmoe: whole-projection q/k norms around the grouped (prefill) and gathered (decode) MoE
        "olmoe": ["moe.gather", "moe.grouped", "rope.triton"],
        # qwen3vlmoe: qwen3moe's per-head q/k norms and renormalized top-k on both MoE paths
        "qwen3vlmoe": ["moe.gather", "moe.grouped", "rope.triton"],
        # ernie4_5-moe: a dense layer, then the softmax MoE with its selection bias and shared experts
        "ernie4_5-moe": ["moe.gather", "moe.grouped", "rope.triton"],
        # exaone: Llama with NEOX rope and the Llama-3 frequency divisors through the rope kernel
        "exaone": ["rope.triton", "attention.decode.triton"],
        # gemma4: window layers of head size 16 and global ones of 32 (each layer its own cache geometry,
        # runtime/kv_cache.py's per-layer form), proportional rope factors, weightless v norm, k as v, scale 1, the GELU kernel
        "gemma4": ["attention.window.decode", "attention.decode.triton", "rope.triton", "geglu.triton"],
        # gemma4-ple: per-layer embeddings (a gather of the per-layer table, GELU gate), layers 3-5 attending
        # over layers 1 and 2's caches, double-wide MLPs on those
        "gemma4-ple": ["attention.window.decode", "attention.decode.triton", "rope.triton", "geglu.triton"],
        # gemma4-moe: the MLP and the experts side by side; the experts' GELU in moe_act's kernel, the fused
        # gate_up tensor, the router on its own input (prefill 10 tokens x top 2 > 16 rows: grouped)
        "gemma4-moe": ["attention.window.decode", "attention.decode.triton", "geglu.triton", "moe.gather",
                       "moe.grouped", "moe.act.triton"],
        # gemma3n: gemma4-ple's attention / per-layer embeddings / shared-KV layers around AltUp's four streams
        # (float32 torch matmuls), LAuReL's rank-16 GEMMs, the sparsified GELU gate on layers 0 and 1
        "gemma3n": ["attention.window.decode", "attention.decode.triton", "rope.triton", "geglu.triton"],
        # lfm2: conv layers (B*x rows in the per-layer cache, the conv in torch ops: shortconv.torch) around
        # two attention layers with per-head q/k norms and NEOX rope
        "lfm2": ["shortconv.torch", "attention.decode.triton", "rope.triton"],
        # lfm2moe: lfm2's layers with the sigmoid / biased / renormalized MoE on both paths
        "lfm2moe": ["shortconv.torch", "attention.decode.triton", "moe.gather", "moe.grouped"],
        # llama4 (chunk 8 set below): prefill across the chunk boundary through the kernels per chunk, the
        # host-free decode step through the decode kernel's CHUNK variant; the NoPE layer's decode kernel, the
        # MoE (top 1 of 10 rows: the gather path; the grouped one in the GPU test's 40-token prefill)
        # mamba2: the Mamba-2 mixer alone in every layer (prefill: conv ring and scan in torch ops; the decode step:
        # ssm_step.py's kernel; the gate and group norm: its norm kernel; the state in the cache)
        "mamba2": SSM,
        # mamba / falcon-mamba: the Mamba-1 mixer alone (prefill: conv ring and selective scan in torch ops; the
        # decode step: ssm1_step.py's conv and scan kernels, falcon-mamba's B/C norms in the scan; the state in the cache)
        "mamba": SSM1, "falcon-mamba": SSM1,
        # jamba: the Mamba-1 mixer on Mamba layers (its weighted B/C norms in the scan kernel), rope-less attention,
        # the softmax top-2 MoE
        "jamba": [*SSM1, "attention.decode.triton", "moe.gather"],
        "llama4": ["attention.chunked.decode", "attention.decode.triton", "rope.triton", "moe.gather"],
        # qwen35: gated DeltaNet layers (prefill: conv ring and chunked delta rule in torch ops; decode: the
        # deltanet_step kernel; the state in the cache) around a gated full-attention layer (per-head q/k norms,
        # partial NEOX rope)
        "qwen35": ["deltanet.conv.torch", "deltanet.scan.torch", "deltanet.step.triton", "attention.decode.triton"],
        "qwen35moe": ["deltanet.conv.torch", "deltanet.scan.torch", "deltanet.step.triton", "attention.decode.triton",
                      "moe.gather"],
        "qwen3next": ["deltanet.conv.torch", "deltanet.scan.torch", "deltanet.step.triton", "attention.decode.triton",
                      "moe.gather"],
        # granitehybrid: Mamba-2 layers (prefill: conv ring and chunked scan in torch ops; decode: the ssm_step
        # kernel; the state in the cache) around a rope-less attention layer, MoE + shared expert; -dense: the
        # shared MLP alone. Every Mamba-2 model below: the prefill's torch ops, the decode's kernel, the norm kernel
        "granitehybrid": [*SSM, "attention.decode.triton", "moe.gather"],
        "granitehybrid-dense": [*SSM, "attention.decode.triton"],
        # nemotron_h: Mamba-2, squared-ReLU MLP (torch ops) and rope-less attention blocks
        "nemotron_h": [*SSM, "relu2.torch", "attention.decode.triton"],
        # falcon-h1: attention with NEOX rope and Mamba-2 in every layer; -nonorm: no group norm after the gate
        "falcon-h1": [*SSM, "attention.decode.triton", "rope.triton"],
        "falcon-h1-nonorm": [*SSM, "attention.decode.triton", "rope.triton"],
        # nemotron_h_moe: nemotron_h's Mamba-2 and attention blocks, MoE blocks of ungated squared-ReLU experts
        # (moe_act's relu2; prefill 10 tokens x top 2 or 3 > 16 rows: grouped, decode: the gather) plus the
        # squared-ReLU shared expert in torch; -latent: the experts between the latent projections
        "nemotron_h_moe": [*SSM, "attention.decode.triton", "moe.gather", "moe.grouped", "moe.act.triton",
                           "relu2.torch"],
        "nemotron_h_moe-latent": [*SSM, "attention.decode.triton", "moe.gather", "moe.grouped", "moe.act.triton",
                                  "relu2.torch"],
        # olmo: weightless LayerNorms (the kernel with a weight of ones), q/k/v clamped before the rope kernel
        "olmo": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        # stablelm: LayerNorms with bias, partial NEOX rope, q/k/v biases; -12b: per-head q/k LayerNorms (a
        # (H, Dh) weight) before the rope kernel, the parallel residual
        "stablelm": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        "stablelm-12b": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
        # nemotron: LayerNorms with bias, partial NEOX rope, the squared-ReLU MLP in torch; -bias: every bias
        "nemotron": ["layer_norm.triton", "rope.triton", "attention.decode.triton", "relu2.torch"],
        "nemotron-bias": ["layer_norm.triton", "rope.triton", "attention.decode.triton", "relu2.torch"],
        # phimoe: RMSNorm plus bias, q/k/v/o biases, NEOX rope, the softmax top-2 renormalized MoE on the grouped
        # (prefill) and gathered (decode) paths, the lm head bias
        "phimoe": ["moe.gather", "moe.grouped", "rope.triton", "attention.decode.triton"],
        # dbrx: LayerNorms without bias, the fused q/k/v clamped, NEOX rope, the softmax top-2 renormalized MoE
        "dbrx": ["layer_norm.triton", "moe.gather", "moe.grouped", "rope.triton", "attention.decode.triton"],
        # exaone-moe: window layers with rope, rope-less global layers, per-head q/k norms, a dense layer, then the
        # sigmoid / grouped / biased MoE with the shared expert on both MoE paths
        "exaone-moe": ["attention.window.decode", "attention.decode.triton", "rope.triton", "moe.gather",
                       "moe.grouped"],
        # minicpm3: deepseek2's latent attention with q_lora (prefill on the torch path, decode the MLA kernel),
        # NEOX rope with LongRoPE factors, the scaled embeddings / residual branches / head
        "minicpm3": ["attention.mla.torch", "attention.mla.decode.triton", "rope.triton"],
        # afmoe: window layers with rope, a rope-less global layer, per-head q/k norms, the sigmoid-gated attention
        # output, post norms, a dense layer, then the sigmoid / biased MoE with the shared expert on both MoE paths
        "afmoe": ["attention.window.decode", "attention.decode.triton", "rope.triton", "moe.gather", "moe.grouped"],
        # jais2: LayerNorms with bias, NEOX rope on the whole head, every bias, the squared-ReLU MLP in torch
        "jais2": ["layer_norm.triton", "rope.triton", "attention.decode.triton", "relu2.torch"],
        # cohere2moe: RMSNorm, window layers with rope, the dense prefix's full attention with rope, a rope-less
        # global layer, the sigmoid MoE with the averaged shared expert; -ln: LayerNorm, the softmax MoE
        "cohere2moe": ["rms_norm.triton", "attention.window.decode", "attention.decode.triton", "moe.gather"],
        "cohere2moe-ln": ["layer_norm.triton", "attention.window.decode", "attention.decode.triton", "moe.gather"],
        # granite_swa: the sinks on window and full layers (T > 1 in torch, the decode kernel's SINK variant), a
        # rope-less layer; granitemoe_swa: the softmax MoE over fused gate/up experts, the fused shared expert
        "granite_swa": ["attention.sinks.torch", "attention.window.decode", "attention.decode.triton"],
        "granitemoe_swa": ["attention.sinks.torch", "attention.window.decode", "attention.decode.triton",
                           "moe.gather"],
        # internlm3: the llama graph (head_dim 24, one kv head); -bias: q/k/v, o and MLP biases (llama_bias.py)
        "internlm3": ["rope.triton", "attention.decode.triton"],
        "internlm3-bias": ["rope.triton", "attention.decode.triton"],
        # olmo3-yarn: the window layers' plain rope, the global layer's YaRN divisors and mscale^2
        "olmo3-yarn": ["attention.window.decode", "attention.decode.triton"],
        # hy_v3: per-head q/k norms before NEOX rope, a dense layer (no router), then the sigmoid / biased MoE
        # (blk.N.exp_probs_b) with the shared expert on both MoE paths
        "hy_v3": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"],
        # mellum: per-head q/k norms before NEOX rope, window layers (the SWA base) and a full layer, the softmax
        # top-k renormalized MoE on both paths
        "mellum": ["rope.triton", "attention.window.decode", "attention.decode.triton", "moe.gather", "moe.grouped"],
        # mimo_v2_flash: per-layer kv heads and geometry (V padded to K's width), partial NEOX rope, the sinks on the
        # window layers (T > 1 in torch, the window decode kernel's SINK variant), full layers without, a dense
        # layer, then the sigmoid / biased MoE on both paths
        "mimo_v2_flash": ["rope.triton", "attention.sinks.torch", "attention.window.decode", "attention.decode.triton",
                          "moe.gather", "moe.grouped"],
        # laguna: per-layer query heads (4 full, 8 window), per-head q/k norms, partial NEOX rope on the full layer and
        # whole-head rope on the window layers, the softplus gate per head (-elem: per element, no window), a dense
        # layer, then the sigmoid / biased MoE with the shared expert on both paths
        "laguna": ["rope.triton", "attention.window.decode", "attention.decode.triton", "moe.gather", "moe.grouped"],
        "laguna-elem": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"],
        # laguna-yarn: the full layer's YaRN divisors through the rope kernel and its mscale^2 on q's rotated dims
        "laguna-yarn": ["rope.triton", "attention.window.decode", "attention.decode.triton"],
        # mellum-yarn: the full layer's YaRN divisors through the rope kernel and mscale^2 on its q
        "mellum-yarn": ["rope.triton", "attention.window.decode", "attention.decode.triton"],
        # mistral4: deepseek2's latent attention with q_lora and YaRN (prefill on the torch path, decode the MLA
        # kernel), the grouped softmax MoE on the fused gate_up experts with the shared expert
        "mistral4": ["attention.mla.torch", "attention.mla.decode.triton", "moe.gather", "rope.triton"],
        # chatglm: q/k/v biases, NORM rope on half of each head through the rope kernel, the fused gate/up MLP
        "chatglm": ["rope.triton", "attention.decode.triton"],
        # bitnet: the sub-norms through the norm kernel, NEOX rope, GQA, the squared-ReLU gate in torch; bitnet-silu:
        # the SiLU gate through the swiglu kernel, MHA
        "bitnet": ["rms_norm.triton", "rope.triton", "attention.decode.triton", "relu2.torch"],
        "bitnet-silu": ["rms_norm.triton", "swiglu.triton", "rope.triton", "attention.decode.triton"],
        # mixtral (llama with experts, models/llama_moe.py): NORM rope, GQA, the softmax top-2 renormalized MoE on
        # the grouped (prefill) and gathered (decode) paths
        "mixtral": ["moe.gather", "moe.grouped", "rope.triton", "attention.decode.triton"],
        # kimi-linear: KDA layers (per-channel decay: conv ring and delta rule in torch ops at every T, kda.py), MLA
        # layers without rope whose V rows are kept apart (attention.mla.torch), the sigmoid / biased MoE
        "kimi-linear": ["kda.conv.torch", "kda.scan.torch", "attention.mla.torch", "moe.gather", "moe.grouped"],
        # muse-glimmer: the weight-less embedding norm and the post-norms through the norm kernel, per-head q/k norms,
        # NORM rope on the window layers only, rope-less global layers, the sigmoid-gated attention output
        "muse-glimmer": ["rms_norm.triton", "rope.triton", "attention.window.decode", "attention.decode.triton"],
        # hrm-text: the weight-less norms through the add-norm kernel (a ones weight), NEOX rope, the SwiGLU kernel,
        # the decode attention over the 12 cache slots of 4 weight blocks
        "hrm-text": ["add_rms_norm.triton", "rope.triton", "swiglu.triton", "attention.decode.triton"]}
# chameleon: the per-head q/k LayerNorms (with bias) through the layer-norm kernel, NORM rope, the decode kernel;
# chameleon-swin: the branch outputs' RMSNorms (swin_norm) through the norm kernel
# 2026-12-07 (fortieth session): gptj's parallel block from one LayerNorm with partial NORM rope; internlm2, minicpm
# (granite's scaled graph), nanbeige (looped layers, a KV slot a pass), maincoder (q/k norm after rope) on llama's;
# deci's per-layer kv heads and attention-free / linear layers; bailingmoe2's sigmoid + biased grouped MoE with a
# shared expert; smallthinker's MoE routed from the layer input with ReGLU experts (moe_act's kernel)
MUST |= {"gptj": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
         "internlm2": ["rope.triton", "attention.decode.triton"],
         "baichuan": ["rope.triton", "attention.decode.triton"], "minicpm": ["rope.triton", "attention.decode.triton"],
         "nanbeige": ["rope.triton", "attention.decode.triton"], "maincoder": ["rope.triton", "attention.decode.triton"],
         "deci": ["attention.decode.triton"],
         "bailingmoe2": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"],
         "smallthinker": ["rope.triton", "attention.decode.triton", "moe.act.triton"],
         "bailingmoe": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"]}   # softmax MoE + shared expert
MUST |= {"chameleon": ["layer_norm.triton", "rope.triton", "attention.decode.triton"],
         "chameleon-swin": ["layer_norm.triton", "rms_norm.triton", "rope.triton", "attention.decode.triton"]}
MUST |= {"pangu-embedded": ["rope.triton", "attention.decode.triton"]}   # llama_bias: q/k/v/o biases, NEOX rope, head 12
MUST |= {"deepseek": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"]}   # dense lead, softmax MoE + shared
MUST |= {"grovemoe": ["rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"]}   # routed + chunk experts: 2 moe_ffn
MUST |= {"xverse": ["rope.triton", "attention.decode.triton"]}   # llama on the converter's permuted q/k, GQA 4/2
MUST |= {"orion": ["layer_norm.triton", "rope.triton", "attention.decode.triton"]}   # stablelm sequential: LayerNorms with bias, NEOX rope
MUST |= {"codeshell": ["layer_norm.triton", "rope.triton", "attention.decode.triton"]}   # fused q/k/v + bias, GQA, NEOX, LayerNorms with bias
MUST |= {"openelm": ["rms_norm.triton", "rope.triton", "attention.decode.triton"]}   # per-layer heads, fused qkv, q/k norm then NEOX
MUST |= {"refact": ["add_rms_norm.triton", "swiglu.triton", "attention.alibi.torch"]}   # ALiBi, no rope, MQA
MUST |= {"plamo": ["add_rms_norm.triton", "swiglu.triton", "rope.triton", "attention.decode.triton"]}   # parallel block
MUST |= {"arctic": ["rms_norm.triton", "rope.triton", "attention.decode.triton", "moe.gather", "moe.grouped"]}   # MoE + MLP
MUST |= {"grok": ["rope.triton", "attention.softcap.torch", "attention.softcap.decode", "moe.gather", "moe.grouped",
                  "moe.act.triton"],
         "grok2": ["rope.triton", "attention.softcap.torch", "attention.softcap.decode", "moe.gather", "moe.grouped",
                   "moe.act.triton", "geglu.triton"]}   # soft-capped scores, GELU experts; grok2: YaRN, dense GELU MLP
MUST |= {"jais": ["layer_norm.triton", "swiglu.triton", "attention.alibi.torch"]}   # ALiBi (1/Dh), biased SwiGLU
# model attributes set after loading: llama4's chunk and temperature floor at the fixture's size (10 tokens)
SMALL = {"llama4": {"chunk": 8, "temp_floor": 4}}
DECODE_ONLY = {"gemma3", "qwen3moe", "granitemoeshared"}   # interpreted prefills of these cost ~50-80 s each


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


@pytest.mark.parametrize("name", ["gemma", "gemma3", "phi2", "phi3partial", "qwen3moe", "olmo2", "olmo3", "gemma2", "granite", "smollm3", "granitemoeshared", "ernie4_5", "glm4", "glm4moe",
                                  "command-r", "command-r-qknorm", "cohere2", "deepseek2", "deepseek3",
                                  "starcoder2",
                                  "falcon", "falcon-40b", "falcon-11b", "starcoder", "gptneox", "gptneox-seq", "gpt2", "bloom", "mpt",
                                  "olmoe", "hunyuan-dense",
                                  "arcee", "apertus", "dots1", "hunyuan-moe", "minimax-m2",
                                  "qwen2vl", "qwen3vl", "qwen3vlmoe", "ernie4_5-moe", "exaone",
                                  "mistral3", "seed_oss", "exaone4", "gemma4", "gemma4-ple", "gemma4-moe", "gemma3n", "lfm2", "lfm2moe", "llama4", "mamba", "falcon-mamba", "mamba2", "jamba",
                                  "qwen35", "qwen35moe", "qwen3next",
                                  "granitehybrid", "granitehybrid-dense", "nemotron_h", "falcon-h1",
                                  "falcon-h1-nonorm", "nemotron_h_moe", "nemotron_h_moe-latent", "olmo",
                                  "stablelm", "stablelm-12b", "nemotron", "nemotron-bias", "phimoe", "dbrx", "exaone-moe", "minicpm3", "afmoe", "jais2",
                                  "cohere2moe", "cohere2moe-ln",
                                  "granite_swa", "granitemoe_swa",
                                  "internlm3", "internlm3-bias",
                                  "olmo3-yarn",
                                  "hy_v3", "mellum", "mimo_v2_flash", "laguna", "laguna-elem",
                                  "laguna-yarn", "mellum-yarn",
                                  "bitnet", "bitnet-silu",
                                  "mistral4", "chatglm", "mixtral",
                                  "glm4moe-lite", "solar-open", "kimi-linear",
                                  "chameleon", "chameleon-swin",
                                  "muse-glimmer", "hrm-text",
                                  "gptj", "internlm2", "baichuan", "minicpm", "nanbeige", "maincoder", "deci", "bailingmoe2",
                                  "smallthinker", "bailingmoe", "pangu-embedded",
                                  "deepseek", "grovemoe", "xverse", "orion", "codeshell", "openelm", "refact",
                                  "plamo", "arctic", "grok", "grok2", "jais"])
def test_arch_cuda_backend_forward_in_every_step_mode(cuda_ops, monkeypatch, name):
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
    for k, v in SMALL.get(name, {}).items():
        setattr(m, k, v)
    n_ctx = 32 if name.startswith("phi3") else 64
    toks = torch.arange(3, 13) * 7 % 300 + 3                       # 10 tokens (> gemma3's window 8)
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, n_ctx)
    ref = m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    cache = KVCache.for_config(m.cfg, n_ctx)
    cache.k.copy_(ref_cache.k)
    cache.v.copy_(ref_cache.v)
    ref_dec = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)

    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    # DECODE_ONLY: the host-free decode step over the reference's prefilled cache (the masked
    # window prefill and the grouped MoE path are checked op by op)
    out = ref if name in DECODE_ONLY else m.forward(toks, Step.at(0, T, "cpu"), cache, ctx)
    dec = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5
    if name == "phi3partial":   # (gemma3's 6 layers in the interpreter cost ~50 s per forward)
        last = m.forward(toks, Step(torch.arange(T), 0, torch.tensor([T - 1])), cache, ctx)
        assert rel(last, ref[-1:]) < 1e-5
    snap = paths.snapshot()
    taken = set(snap["counts"]) | {k.split(" (")[0] for k in snap["fallbacks"]}   # SDPA's masked
    for p in MUST.get(name, []):                                  # kernel falls back on the CPU
        assert p in taken, (p, snap)


def test_bert_cuda_backend_prefill(cuda_ops, monkeypatch):
    """bert (an encoder: one forward from position 0, no decode, no cache) through the CUDA backend's code: the
    embedding kernel on the token and position tables, the LayerNorm kernel with its bias, the q/k/v group with
    biases, the bidirectional attention's counted torch path; the hidden rows an embeddings run takes (Model.head's
    hidden_sink), all and the last only, against the reference forward."""
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.models.base import HiddenTaken
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / "bert.gguf"), progress=False)
    toks = torch.arange(3, 13) * 7 % 300 + 3
    T = len(toks)

    def hidden(step, ctx=None):
        rows = []
        m.hidden_sink = rows.append
        try:
            with pytest.raises(HiddenTaken):
                m.forward(toks, step, None, ctx)
        finally:
            m.hidden_sink = None
        return rows[0]

    ref = hidden(Step.at(0, T, "cpu"))
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    out = hidden(Step.at(0, T, "cpu"), ctx)
    last = hidden(Step.at(0, T, "cpu", "last"), ctx)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert out.shape == (T, 64) and rel(out, ref) < 1e-5 and rel(last, ref[-1:]) < 1e-5
    snap = paths.snapshot()
    taken = set(snap["counts"]) | {k.split(" (")[0] for k in snap["fallbacks"]}
    for p in ("layer_norm.triton", "attention.bidirectional.torch"):
        assert p in taken, (p, snap)
    with pytest.raises(MinferError, match="bert is an encoder"):
        m.forward(toks, Step.at(0, T, "cpu"), None, ctx)
