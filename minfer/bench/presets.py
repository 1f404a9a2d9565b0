"""Model geometries for `minfer synth`: real models' shapes, random weights.

Each preset is the hyper-parameter set of a published model (its config.json, as written
into GGUF by llama.cpp's convert_hf_to_gguf.py). `tiny` is for tests: small enough to run on
the CPU in a second, yet it keeps what the kernels care about -- grouped-query attention
(4 query heads per kv head), rows that are multiples of 256 (k-quants apply) and one row
length that is not (ffn 640 = 2.5 x 256, so ffn_down falls back like llama.cpp does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minfer.errors import MinferError


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str            # one of synth.SYNTH_ARCHS
    hidden: int          # embedding_length
    ffn: int             # feed_forward_length
    n_layers: int        # block_count
    n_head: int
    n_kv_head: int
    head_dim: int
    vocab: int
    rope_base: float
    rms_eps: float
    ctx: int             # context_length written to the file
    tied: bool = False   # no output.weight: the output projection reuses token_embd
    # newer families (defaults: absent)
    n_expert: int = 0            # expert_count (qwen3moe); 0: a dense FFN
    n_expert_used: int = 0       # expert_used_count
    expert_ffn: int = 0          # expert_feed_forward_length
    sliding_window: int = 0      # gemma3: the local layers' window (llama.cpp pattern: 5 local, 1 global)
    rope_swa_base: float = 0.0   # gemma3: the local layers' rope base (rope.freq_base_swa)
    rope_scaling: tuple = ()     # ("linear", factor) or ("llama3", factor, low_freq, high_freq, original ctx)
    rope_dims: int = 0           # rope.dimension_count when only part of a head rotates (glm4: half); 0: all
    multipliers: tuple = ()      # granite: (embedding, attention, residual, logit) scales

    def with_overrides(self, arch: str | None = None, layers: int | None = None,
                       vocab: int | None = None) -> "Preset":
        p = self
        if arch is not None:
            p = replace(p, arch=arch)
        if layers is not None:
            if layers < 1:
                raise MinferError(f"--layers {layers}: expected at least 1 layer")
            p = replace(p, n_layers=layers)
        if vocab is not None:
            if vocab < 300:
                raise MinferError(f"--vocab {vocab}: expected at least 300 (256 byte tokens, merges "
                                  "and special tokens)")
            p = replace(p, vocab=vocab)
        return p

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim


PRESETS: dict[str, Preset] = {p.name: p for p in [
    # The benchmark geometry of ../shared/MODELS.md (Qwen2.5-7B).
    Preset("qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 1e6, 1e-6, 32768),
    Preset("qwen2.5-1.5b", "qwen2", 1536, 8960, 28, 12, 2, 128, 151936, 1e6, 1e-6, 32768),
    # 896 is not a multiple of 256: most tensors fall back to Q5_0/Q8_0, like the real file.
    Preset("qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 1e6, 1e-6, 32768),
    Preset("llama-3-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 5e5, 1e-5, 8192),
    Preset("smollm2-135m", "llama", 576, 1536, 30, 9, 3, 64, 49152, 1e5, 1e-5, 8192, tied=True),
    Preset("tiny", "qwen2", 256, 640, 4, 4, 1, 64, 512, 1e6, 1e-6, 2048),
    # Issue 16's families (config.json of each, as convert_hf_to_gguf.py writes it)
    Preset("qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 1e6, 1e-6, 40960),
    Preset("llama3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 5e5, 1e-5, 131072,
           rope_scaling=("llama3", 8.0, 1.0, 4.0, 8192)),
    # vocab: the converter keeps the tokenizer's 262144 of the config's 262208 rows
    Preset("gemma3-4b", "gemma3", 2560, 10240, 34, 8, 4, 256, 262144, 1e6, 1e-6, 131072, tied=True,
           sliding_window=1024, rope_swa_base=1e4, rope_scaling=("linear", 8.0)),
    # Gemma-2-2B: layers alternate local (window 4096) and global; soft-caps 50 / 30 (synth.py)
    Preset("gemma2-2b", "gemma2", 2304, 9216, 26, 8, 4, 256, 256000, 1e4, 1e-6, 8192, tied=True,
           sliding_window=4096),
    Preset("olmo2-7b", "olmo2", 4096, 11008, 32, 32, 32, 128, 100352, 5e5, 1e-6, 4096),   # OLMo-2-1124-7B
    # 2026-12-04's architectures (config.json of each, as the converter writes it)
    Preset("granite-3.3-8b", "granite", 4096, 12800, 40, 32, 8, 128, 49159, 1e7, 1e-5, 131072, tied=True,
           multipliers=(12.0, 0.0078125, 0.22, 16.0)),
    Preset("smollm3-3b", "smollm3", 2048, 11008, 36, 16, 4, 128, 128256, 5e6, 1e-6, 65536, tied=True),
    Preset("ernie4.5-0.3b", "ernie4_5", 1024, 3072, 18, 16, 2, 64, 103424, 5e5, 1e-5, 131072, tied=True),
    Preset("glm4-9b", "glm4", 4096, 13696, 40, 32, 2, 128, 151552, 1e4, 1e-5, 32768, rope_dims=64),
    Preset("qwen3-30b-a3b", "qwen3moe", 2048, 6144, 48, 32, 4, 128, 151936, 1e6, 1e-6, 40960,
           n_expert=128, n_expert_used=8, expert_ffn=768),
    Preset("tiny-moe", "qwen3moe", 256, 640, 2, 4, 1, 64, 512, 1e6, 1e-6, 2048,
           n_expert=8, n_expert_used=2, expert_ffn=256),
]}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise MinferError(f"--preset {name!r}: unknown preset (expected one of {', '.join(PRESETS)})")
    return PRESETS[name]
