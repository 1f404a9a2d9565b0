"""The GPT-J fixture (tests/data/arch/gptj.{gguf,npz,json}): tools/gen_arch_fixtures.py's steps, with a GPT-J
converter registered in llama.cpp's convert_hf_to_gguf.py.

    python tools/gptj_fixture.py --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp

llama.cpp 0.3.36 knows the architecture by name only: LLM_ARCH_GPTJ "gptj" (src/llama-arch.cpp) and its tensor list
(gguf-py constants.py MODEL_TENSORS[MODEL_ARCH.GPTJ]: token_embd, output_norm, output, attn_norm, attn_qkv,
attn_q, attn_k, attn_v, attn_output, ffn_up, ffn_down), the HF names of GPT-J in gguf-py tensor_mapping.py
(transformer.wte, transformer.ln_f, transformer.h.{bid}.ln_1, .attn.{q,k,v,out}_proj, .mlp.fc_in, .mlp.fc_out,
"# gpt-j") and the comment "gpt-j n_rot = rotary_dim" (src/llama-model.cpp, load_hparams). Its converter has no
GPT-J class (conversion/__init__.py TEXT_MODEL_MAP has no GPTJForCausalLM) and llama.cpp builds no gptj graph
(llama-model.cpp's model factory: "unsupported model architecture"). So the file is written here by llama.cpp's
own converter machinery (its TextModel: the vocabulary by _set_vocab_gpt2, the tensor names by gguf-py's map, f16
2-D weights) through a small converter class (CONVERT_CODE) that writes the keys GPT-J needs under the standard
names (gguf-py Keys.LLM / Keys.Rope): block_count, context_length (n_positions), embedding_length,
feed_forward_length (n_inner, else 4 n_embd as HF's GPTJBlock), attention.head_count, attention.layer_norm_epsilon,
rope.dimension_count (rotary_dim; HF's None: the whole head). No head_count_kv (MHA) and no rope.freq_base (HF
GPT-J's fixed 10000 is llama.cpp's default). The tensors need no reordering: HF's q/k already rotate adjacent
pairs (rotate_every_two), ggml's NORM rope.

The config is tools/arch_fixture_configs_c.py ARCHS_GPTJ (kept out of ARCHS, so that a plain gen_arch_fixtures.py
run, which has no GPT-J converter, does not stop at it); biases drawn around 0 (CENTERED_BIAS).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gen_arch_fixtures as gen
from arch_fixture_configs_c import ARCHS_GPTJ

# run in the converter's process before convert_hf_to_gguf (gen_arch_fixtures.convert's `extra`)
CONVERT_CODE = (
    "import conversion as _conv\n"
    "from conversion.base import ModelBase as _MB, TextModel as _TM, gguf as _gguf\n"
    "class GPTJModel(_TM):\n"
    "    model_arch = _gguf.MODEL_ARCH.GPTJ\n"
    "    def set_gguf_parameters(self):\n"
    "        h, w = self.hparams, self.gguf_writer\n"
    "        w.add_block_count(self.block_count)\n"
    "        w.add_context_length(h['n_positions'])\n"
    "        w.add_embedding_length(h['n_embd'])\n"
    "        w.add_feed_forward_length(h.get('n_inner') or 4 * h['n_embd'])\n"
    "        w.add_head_count(h['n_head'])\n"
    "        w.add_layer_norm_eps(h['layer_norm_epsilon'])\n"
    "        w.add_rope_dimension_count(h.get('rotary_dim') or h['n_embd'] // h['n_head'])\n"
    "        w.add_file_type(self.ftype)\n"
    "_MB.register('GPTJForCausalLM')(GPTJModel)\n"
    "_conv.TEXT_MODEL_MAP['GPTJForCausalLM'] = 'gpt2'   # a module to import; the class is registered above\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp", required=True, type=Path,
                    help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    gen.ARCHS.update(ARCHS_GPTJ)
    gen.CENTERED_BIAS.update(ARCHS_GPTJ)
    convert = gen.convert

    def convert_gptj(model_dir, out, llamacpp, raw_config=False, no_mtp=False, extra=""):
        convert(model_dir, out, llamacpp, raw_config=raw_config, no_mtp=no_mtp, extra=extra + CONVERT_CODE)

    gen.convert = convert_gptj
    gen.OUT.mkdir(parents=True, exist_ok=True)
    for name in ARCHS_GPTJ:
        gen.build(name, a.llamacpp.resolve(), a.seed)


if __name__ == "__main__":
    main()
