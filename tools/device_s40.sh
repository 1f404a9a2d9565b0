#!/usr/bin/env bash
# Device calls of the 2026-12-07 fortieth session (none ran: the device paused its loans; perf-log CJ1), for the next:
#   run(command="MINFER_COMMIT=<sha> AB=0 bash tools/device_s40.sh enc arch flag embed; true", carry=[".whl"])
# arch: the session's new decoder architectures in tests/gpu/test_arch_gpu.py (ARCH_K: the -k expression).
# enc: the GPU test files of this session's encoders and rerankers (float32 on cuda against llama.cpp's goldens,
#   bf16 against the CPU float32 engine within test_embed_gpu.py's floor-based bound), whichever exist in the tree.
# Other steps go to tools/device_s39.sh (flag, timeline; then s38 suite / embed, s37 ...).
set -u
rest=""
for step in ${*:-enc}; do
  t0=$(date +%s)
  case $step in
    enc)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      files=""
      for f in tests/gpu/test_qwen3_rank_gpu.py tests/gpu/test_jina_bert_gpu.py tests/gpu/test_nomic_moe_gpu.py \
               tests/gpu/test_gemma_embedding_gpu.py tests/gpu/test_encoders_gpu.py; do
        [ -f "$f" ] && files="$files $f"
      done
      timeout ${ENC_TIMEOUT:-300} python3 -m pytest -m gpu -q -rP -p no:cacheprovider $files >"$OUT/pytest-enc.log" 2>&1
      echo "enc rc $?"; grep -E "bf16|^(FAILED|ERROR)" "$OUT/pytest-enc.log" | head -24
      tail -1 "$OUT/pytest-enc.log";;
    arch)   # this session's decoder architectures through tests/gpu/test_arch_gpu.py (float32 vs the references, bf16 floors)
      source tools/device_setup.sh >/dev/null
      timeout ${ARCH_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_arch_gpu.py \
        -k "${ARCH_K:-gptj or internlm2 or minicpm or deci or bailingmoe or smallthinker or nanbeige or maincoder or baichuan}" \
        >"$OUT/pytest-arch.log" 2>&1
      echo "arch rc $?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest-arch.log" | head -20; tail -1 "$OUT/pytest-arch.log";;
    *) rest="$rest $step";;
  esac
  case $step in enc|arch) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s39.sh $rest
exit 0
