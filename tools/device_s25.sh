#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-fifth session: perf-log AU0's oracle (tools/skip_oracle.py with
# --check: each variant replayed once after its capture, so a CUDA fault names its variant; the attention
# variants and the SwiGLU-2 switch in separate processes), then tools/device_s24.sh's steps (bench, tests ...).
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s25.sh oracle bench; true", carry=[".whl"])
# side: llama.cpp side by side on the card that came (perf-log AU1): .lcpp.tar.xz (untracked, made from the
# llama-cpp-python 0.3.36 sdist's vendor/llama.cpp trimmed to src, common, ggml-cpu/-cuda, vendor, llama-bench
# and batched-bench, with models/ggml-vocab-qwen2.gguf) built with CUDA for sm_90 in the background while
# minfer synthesizes the 0.5B, 1.5B and 7B geometries (Q4_K_M, the qwen2 vocab copied in so llama.cpp loads
# them); then, per model, llama-bench / minfer bench / llama-bench (-p 0 -n 128, -fa 1; the 7B also -d 3354).
set -u
if [ -f .head.tgz ]; then
  tar xzf .head.tgz
  for f in tests/gpu/*.py; do tar tzf .head.tgz | grep -qx "$f" || rm -f "$f"; done   # uncommitted test files
fi
STEPS=${*:-oracle}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
Q7=/tmp/q7.gguf
[ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    oracle)
      i=0
      for group in ${ORACLE_GROUPS:-"-attn -combine short short&-attn" "env:MINFER_GEMV_SWIGLU=2"}; do
        i=$((i + 1))
        timeout ${ORACLE_TIMEOUT:-200} python3 tools/skip_oracle.py $Q7 ${ORACLE_DEPTHS:-100 3354} -- $group --check \
          >"$OUT/oracle-$i.log" 2>&1
        echo "oracle group $i ($group): rc $?"
        grep -E "^\||^depth|left out|^\(capturing|^\(replayed|Error" "$OUT/oracle-$i.log" | grep -v "^|---" | tail -20
      done;;
    side)
      V=/tmp/lc/llama.cpp/ggml-vocab-qwen2.gguf
      mkdir -p /tmp/lc && tar xJf .lcpp.tar.xz -C /tmp/lc
      ( cmake -S /tmp/lc/llama.cpp -B /tmp/lc/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
          -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
          -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/tmp/lc/cmake.log 2>&1 \
        && cmake --build /tmp/lc/build -j16 --target llama-bench >/tmp/lc/build.log 2>&1; echo "build rc $?" >/tmp/lc/done ) &
      for p in ${SIDE_MODELS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
        [ -f /tmp/side-$p.gguf ] || python3 -m minfer synth /tmp/side-$p.gguf --preset $p --recipe q4_k_m \
          --tokenizer-from $V --no-progress >>/tmp/synth-side.log 2>&1
      done
      while [ ! -f /tmp/lc/done ]; do sleep 2; done
      cat /tmp/lc/done; tail -3 /tmp/lc/build.log; cp /tmp/lc/build.log "$OUT/llama-build.log" 2>/dev/null
      LB=/tmp/lc/build/bin/llama-bench
      for p in ${SIDE_MODELS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
        d="0"; case $p in *7b) d="0,3354";; esac
        for who in llama minfer llama; do
          if [ $who = llama ]; then
            timeout 150 $LB -m /tmp/side-$p.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r ${REPS:-3} >>"$OUT/side-$p.log" 2>&1
          else
            MINFER_DEBUG_PATHS=1 timeout 150 python3 -m minfer bench -m /tmp/side-$p.gguf -p 0 -n 128 -d $d -r ${REPS:-3} \
              --out "/tmp/side-$p-minfer.json" --no-progress >>"$OUT/side-$p.log" 2>&1
          fi
        done
        cp /tmp/side-$p-minfer.json "$OUT/" 2>/dev/null
        echo "== $p"; grep -E "tg128" "$OUT/side-$p.log"; grep -iE "fell back|fallback" "$OUT/side-$p.log" | head -3
      done;;
    *) OUT=$OUT bash tools/device_s24.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
