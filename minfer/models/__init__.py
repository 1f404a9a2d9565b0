"""Model architectures by GGUF `general.architecture`: the one list of supported architectures.

config.py (rope style, the support check), gguf_file users, the benchmark's synthetic models
and the torch peer all read ARCHITECTURES; adding an architecture is a new file here and one
line below (README "Adding an architecture").
"""

from __future__ import annotations

from minfer.errors import MinferError
from minfer.models.base import Model, Step
from minfer.models.llama import LlamaModel
from minfer.models.qwen2 import Qwen2Model
from minfer.models.qwen2moe import Qwen2MoeModel
from minfer.models.stablelm import StablelmModel
from minfer.models.nemotron import NemotronModel
from minfer.models.starcoder2 import Starcoder2Model
from minfer.models.hunyuan_dense import HunyuanDenseModel
from minfer.models.olmoe import OlmoeModel
from minfer.models.qwen2vl import Qwen2VLModel
from minfer.models.qwen3vl import Qwen3VLModel
from minfer.models.qwen3vlmoe import Qwen3VLMoeModel
from minfer.models.ernie4_5 import Ernie45Model
from minfer.models.ernie4_5_moe import Ernie45MoeModel
from minfer.models.gemma import GemmaModel
from minfer.models.gemma2 import Gemma2Model
from minfer.models.gemma3 import Gemma3Model
from minfer.models.glm4 import Glm4Model
from minfer.models.glm4moe import Glm4MoeModel
from minfer.models.granite import GraniteModel
from minfer.models.granitemoe import GraniteMoeModel
from minfer.models.granitehybrid import GraniteHybridModel
from minfer.models.nemotron_h import NemotronHModel
from minfer.models.nemotron_h_moe import NemotronHMoeModel
from minfer.models.falcon_h1 import FalconH1Model
from minfer.models.gpt_oss import GptOssModel
from minfer.models.olmo import OlmoModel
from minfer.models.olmo2 import Olmo2Model
from minfer.models.phi2 import Phi2Model
from minfer.models.gptj import GptjModel
from minfer.models.phi3 import Phi3Model
from minfer.models.phimoe import PhimoeModel
from minfer.models.dbrx import DbrxModel
from minfer.models.qwen3 import Qwen3Model
from minfer.models.qwen3moe import Qwen3MoeModel
from minfer.models.smollm3 import SmolLM3Model
from minfer.models.command_r import CommandRModel
from minfer.models.cohere2 import Cohere2Model
from minfer.models.deepseek2 import Deepseek2Model
from minfer.models.mistral3 import Mistral3Model
from minfer.models.seed_oss import SeedOssModel
from minfer.models.exaone import ExaoneModel
from minfer.models.exaone4 import Exaone4Model
from minfer.models.exaone_moe import ExaoneMoeModel
from minfer.models.minicpm3 import MiniCPM3Model
from minfer.models.minicpm import MiniCPMModel
from minfer.models.mistral4 import Mistral4Model
from minfer.models.afmoe import AfmoeModel
from minfer.models.jais2 import Jais2Model
from minfer.models.gemma3n import Gemma3nModel
from minfer.models.gemma4 import Gemma4Model
from minfer.models.lfm2 import Lfm2Model
from minfer.models.lfm2moe import Lfm2MoeModel
from minfer.models.llama4 import Llama4Model
from minfer.models.mamba1 import Mamba1Model
from minfer.models.jamba import JambaModel
from minfer.models.mamba2_lm import Mamba2Model
from minfer.models.qwen35 import Qwen35Model
from minfer.models.qwen35moe import Qwen35MoeModel
from minfer.models.qwen3next import Qwen3NextModel
from minfer.models.arcee import ArceeModel
from minfer.models.apertus import ApertusModel
from minfer.models.dots1 import Dots1Model
from minfer.models.hunyuan_moe import HunyuanMoeModel
from minfer.models.minimax_m2 import MinimaxM2Model
from minfer.models.falcon import FalconModel
from minfer.models.starcoder import StarcoderModel
from minfer.models.gptneox import GptneoxModel
from minfer.models.gpt2 import Gpt2Model
from minfer.models.bloom import BloomModel
from minfer.models.mpt import MptModel
from minfer.models.cohere2moe import Cohere2MoeModel
from minfer.models.granite_swa import GraniteSwaModel
from minfer.models.hy_v3 import HyV3Model
from minfer.models.mellum import MellumModel
from minfer.models.mimo2 import Mimo2Model
from minfer.models.laguna import LagunaModel
from minfer.models.chatglm import ChatGLMModel
from minfer.models.internlm2 import InternLM2Model
from minfer.models.baichuan import BaichuanModel
from minfer.models.nanbeige import NanbeigeModel
from minfer.models.maincoder import MaincoderModel
from minfer.models.pangu_embed import PanguEmbedModel
from minfer.models.deepseek import DeepseekModel
from minfer.models.bitnet import BitnetModel
from minfer.models.kimi_linear import KimiLinearModel
from minfer.models.muse_glimmer import MuseGlimmerModel
from minfer.models.hrm_text import HrmTextModel
from minfer.models.chameleon import ChameleonModel
from minfer.models.bert import BertModel
from minfer.models.nomic_bert import NomicBertModel
from minfer.models.nomic_bert_moe import NomicBertMoeModel
from minfer.models.modern_bert import ModernBertModel
from minfer.models.jina_bert import JinaBertV2Model
from minfer.models.gemma_embedding import GemmaEmbeddingModel
from minfer.models.eurobert import EuroBertModel
from minfer.models.llama_embed import LlamaEmbedModel
from minfer.models.deci import DeciModel
from minfer.models.jina_bert_v3 import JinaBertV3Model
from minfer.models.t5encoder import T5EncoderModel
from minfer.models.bailingmoe2 import BailingMoe2Model
from minfer.models.bailingmoe import BailingMoeModel
from minfer.models.smallthinker import SmallThinkerModel
from minfer.models.grovemoe import GroveMoeModel
from minfer.models.xverse import XverseModel
from minfer.models.orion import OrionModel
from minfer.models.codeshell import CodeshellModel
from minfer.models.openelm import OpenElmModel
from minfer.models.refact import RefactModel
from minfer.models.plamo import PlamoModel
from minfer.models.arctic import ArcticModel
from minfer.models.grok import GrokModel
from minfer.models.jais import JaisModel

ARCHITECTURES: dict[str, type[Model]] = {cls.arch: cls for cls in (
    BloomModel, MptModel,
    LlamaModel, Qwen2Model, Qwen3Model, GemmaModel, Gemma2Model, Gemma3Model, Phi2Model, Phi3Model, PhimoeModel, DbrxModel, Qwen3MoeModel, Qwen2MoeModel,
    OlmoModel, StablelmModel, NemotronModel, Olmo2Model, GraniteModel, GraniteMoeModel, GraniteHybridModel, SmolLM3Model, Ernie45Model, Glm4Model, Glm4MoeModel, GptOssModel,
    CommandRModel, Cohere2Model, Deepseek2Model, Mistral3Model,
    ArceeModel, ApertusModel, Dots1Model, HunyuanMoeModel, MinimaxM2Model,
    SeedOssModel, Exaone4Model, ExaoneMoeModel, Gemma3nModel, Gemma4Model, Qwen2VLModel, Qwen3VLModel, Lfm2Model, Lfm2MoeModel, Llama4Model, Mamba1Model, JambaModel, Mamba2Model, OlmoeModel, Starcoder2Model,
    HunyuanDenseModel, Qwen3VLMoeModel, Ernie45MoeModel, NemotronHModel, NemotronHMoeModel, FalconH1Model, ExaoneModel,
    FalconModel, StarcoderModel, GptneoxModel, Gpt2Model,
    Qwen35Model, Qwen35MoeModel, Qwen3NextModel,
    MiniCPM3Model, AfmoeModel, Jais2Model, Cohere2MoeModel,
    GraniteSwaModel,
    MiniCPMModel,
    HyV3Model, MellumModel, Mimo2Model, LagunaModel,
    Mistral4Model, ChatGLMModel, BitnetModel, KimiLinearModel,
    InternLM2Model,
    BaichuanModel,
    NanbeigeModel,
    MaincoderModel,
    PanguEmbedModel,
    DeepseekModel,
    MuseGlimmerModel,
    HrmTextModel,
    ChameleonModel,
    JinaBertV2Model,
    EuroBertModel,
    LlamaEmbedModel,
    BertModel, NomicBertModel, ModernBertModel,
    GptjModel,
    NomicBertMoeModel,
    DeciModel,
    JinaBertV3Model,
    T5EncoderModel,
    BailingMoe2Model,
    BailingMoeModel,
    SmallThinkerModel,
    GroveMoeModel,
    XverseModel,
    OrionModel,
    CodeshellModel,
    OpenElmModel,
    RefactModel,
    PlamoModel,
    ArcticModel,
    GrokModel,
    JaisModel,
    GemmaEmbeddingModel)}

__all__ = ["ARCHITECTURES", "Model", "Step", "model_class", "load_model"]


def unsupported(arch: str) -> str:
    """The message for an architecture minfer does not run."""
    msg = f"architecture '{arch}' is not supported (supported: {', '.join(ARCHITECTURES)})"
    if arch == "clip":    # llama.cpp's mmproj files (convert_hf_to_gguf.py --mmproj; gguf-py MODEL_ARCH.MMPROJ)
        msg += ("; this is a vision/audio projector (mmproj) file: load the language model's own GGUF "
                "(e.g. qwen2vl, qwen3vl), text input only")
    return msg


def model_class(arch: str) -> type[Model]:
    if arch not in ARCHITECTURES:
        raise MinferError(unsupported(arch))
    return ARCHITECTURES[arch]


def load_model(gf, device="cpu", dtype=None, progress: bool = True, act_dtype=None) -> Model:
    """The model of a GGUFFile, its weights on `device` (act_dtype: the matmul input and KV
    cache dtype; default float32 on the CPU, bf16 on CUDA)."""
    import torch

    from minfer.config import ModelConfig
    from minfer.models.llama import activation_dtype

    cfg = ModelConfig.from_gguf(gf)
    return model_class(cfg.arch).from_gguf(gf, cfg, device=device, dtype=dtype or torch.float32,
                                           progress=progress,
                                           act_dtype=act_dtype or activation_dtype(device))
