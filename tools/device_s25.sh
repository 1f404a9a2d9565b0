#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-fifth session: perf-log AU0's oracle (tools/skip_oracle.py with
# --check: each variant replayed once after its capture, so a CUDA fault names its variant; the attention
# variants and the SwiGLU-2 switch in separate processes), then tools/device_s24.sh's steps (bench, tests ...).
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s25.sh oracle bench; true", carry=[".whl"])
# side: llama.cpp side by side on the card that came (perf-log AU1): .lcpp.tar.xz (untracked; tools/lcpp_trim.sh makes it from the
# llama-cpp-python 0.3.36 sdist's vendor/llama.cpp trimmed to src, common, ggml-cpu/-cuda, vendor, llama-bench
# and batched-bench, with models/ggml-vocab-qwen2.gguf) built with CUDA for sm_90 in the background while
# minfer synthesizes the 0.5B, 1.5B and 7B geometries (Q4_K_M, the qwen2 vocab copied in so llama.cpp loads
# them); then, per model, llama-bench / minfer bench / llama-bench (-p 0 -n 128, -fa 1; the 7B also -d 3354).
set -u
STEPS=${*:-oracle}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
Q7=/tmp/q7.gguf
[ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
build_llama() {   # llama-bench from .lcpp.tar.xz, in the background; /tmp/lc/done when it ends
  [ -f /tmp/lc/started ] && return 0
  mkdir -p /tmp/lc && tar xJf .lcpp.tar.xz -C /tmp/lc && touch /tmp/lc/started
  ( cmake -S /tmp/lc/llama.cpp -B /tmp/lc/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/tmp/lc/cmake.log 2>&1 \
    && cmake --build /tmp/lc/build -j16 --target llama-bench >/tmp/lc/build.log 2>&1; echo "build rc $?" >/tmp/lc/done ) &
}
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
    build)   # llama-bench's build started in the background (a later `side`, in this call, waits for it)
      build_llama;;
    side)
      V=/tmp/lc/llama.cpp/ggml-vocab-qwen2.gguf
      build_llama
      for p in ${SIDE_MODELS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
        Vp=$V; case $p in llama*) Vp=/tmp/lc/llama.cpp/ggml-vocab-llama-bpe.gguf;; esac   # lcpp_trim.sh qwen2 llama-bpe
        [ -f /tmp/side-$p.gguf ] || python3 -m minfer synth /tmp/side-$p.gguf --preset $p --recipe q4_k_m \
          --tokenizer-from $Vp --no-progress >>/tmp/synth-side.log 2>&1
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
    small)   # perf-log AU2: the small models' raw-block decode (one pass, stacked groups): GPU tests while
             # llama.cpp builds, then the 0.5B side by side (llama.cpp, minfer, minfer with both switches off,
             # llama.cpp) and an in-process A/B of the switches
      build_llama
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${SMALL_TESTS_TIMEOUT:-300} python3 -m pytest -m gpu -q $xd -p no:cacheprovider \
        tests/gpu/test_gemv_raw_group_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_arch_gpu.py \
        tests/gpu/test_cuda_graphs.py tests/gpu/test_batching_gpu.py >"$OUT/pytest-small.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-small.log" | head -20
      echo "small tests: $(tail -1 "$OUT/pytest-small.log")"
      V=/tmp/lc/llama.cpp/ggml-vocab-qwen2.gguf
      while [ ! -f /tmp/lc/done ]; do sleep 2; done; cat /tmp/lc/done
      M5=/tmp/side-qwen2.5-0.5b.gguf
      [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --tokenizer-from $V --no-progress >/dev/null 2>&1
      L=$OUT/small-0.5b.log
      timeout 120 /tmp/lc/build/bin/llama-bench -m $M5 -ngl 99 -fa 1 -p 0 -n 128 -r 3 >>$L 2>&1
      MINFER_DEBUG_PATHS=1 timeout 150 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 3 --out /tmp/small-on.json --no-progress >>$L 2>&1
      MINFER_GEMV_RAW_FUSE=0 MINFER_GEMV_ONE_PASS=0 timeout 150 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 3 \
        --out /tmp/small-off.json --no-progress >>$L 2>&1
      timeout 120 /tmp/lc/build/bin/llama-bench -m $M5 -ngl 99 -fa 1 -p 0 -n 128 -r 3 >>$L 2>&1
      timeout 240 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 --ab "MINFER_GEMV_RAW_FUSE=0,MINFER_GEMV_ONE_PASS=0" \
        "MINFER_GEMV_RAW_FUSE=1,MINFER_GEMV_ONE_PASS=1" --pairs ${PAIRS:-4} --no-progress >"$OUT/small-ab.log" 2>&1
      cp /tmp/small-on.json "$OUT/"
      grep "tg128" $L; grep -E "B/A|pair " "$OUT/small-ab.log" | tail -6;;
    rawpdl)  # perf-log AU3: the raw GEMV with PDL -- its GPU tests, the 0.5B in-process A/B of the switch,
             # then the broader GPU tests the raw paths touch
      timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gemv_raw_group_gpu.py \
        >"$OUT/pytest-rawpdl.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-rawpdl.log" | head; echo "raw tests: $(tail -1 "$OUT/pytest-rawpdl.log")"
      M5=/tmp/side-qwen2.5-0.5b.gguf
      [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --no-progress >/dev/null 2>&1
      MINFER_DEBUG_PATHS=1 timeout 150 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 --ab "MINFER_GEMV_RAW_PDL=0" \
        "MINFER_GEMV_RAW_PDL=1" --pairs ${PAIRS:-4} --out /tmp/rawpdl-ab.json --no-progress >"$OUT/rawpdl-ab.log" 2>&1
      grep -E "B/A|pair |tg128" "$OUT/rawpdl-ab.log" | tail -8; grep -E "gemv_raw|Traceback|Error" "$OUT/rawpdl-ab.log" | head -5
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${RAW_TESTS_TIMEOUT:-110} python3 -m pytest -m gpu -q $xd -p no:cacheprovider tests/gpu/test_arch_gpu.py \
        tests/gpu/test_cuda_graphs.py tests/gpu/test_kernels_gpu.py >"$OUT/pytest-rawpdl-wide.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-rawpdl-wide.log" | head; echo "wide: $(tail -1 "$OUT/pytest-rawpdl-wide.log")";;
    *) OUT=$OUT bash tools/device_s24.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
