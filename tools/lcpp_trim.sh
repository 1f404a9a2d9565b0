#!/usr/bin/env bash
# Make .lcpp.tar.xz: llama.cpp's source as vendored by the llama-cpp-python 0.3.36 sdist, trimmed to what
# `llama-bench` needs, plus vocab-only files for `minfer synth --tokenizer-from`, small enough (~3.6 MB with the
# qwen2 vocab) to travel with a device call (tools/device_s25.sh side / small build it there with CUDA, sm_90).
#   bash tools/lcpp_trim.sh [VOCAB ...]      (default vocab: qwen2; e.g. `qwen2 llama-bpe` for llama-3 presets)
# Kept: CMakeLists.txt, cmake/, include/, src/, common/, vendor/, ggml/ (CMake files, include/, the top-level
# sources, ggml-cpu/, ggml-cuda/), tools/llama-bench and tools/batched-bench, with tools/CMakeLists.txt cut to
# those two. The device configures it with -DLLAMA_BUILD_APP=OFF (the unified binary's app/ is left out).
set -eu
SDIST=${SDIST:-/tmp/arch/llama_cpp_python-0.3.36}
if [ ! -d "$SDIST/vendor/llama.cpp" ]; then
  mkdir -p /tmp/arch
  python3 -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/arch >/dev/null
  tar xzf /tmp/arch/llama_cpp_python-0.3.36.tar.gz -C /tmp/arch
fi
SRC=$SDIST/vendor/llama.cpp
W=$(mktemp -d)
D=$W/llama.cpp
mkdir -p "$D/ggml/src" "$D/tools"
cp -r "$SRC"/{CMakeLists.txt,cmake,include,src,common,vendor,licenses,LICENSE} "$D/"
cp -r "$SRC"/ggml/{CMakeLists.txt,cmake,include} "$D/ggml/"
find "$SRC/ggml/src" -maxdepth 1 -type f -exec cp {} "$D/ggml/src/" \;
cp -r "$SRC"/ggml/src/{ggml-cpu,ggml-cuda} "$D/ggml/src/"
cp -r "$SRC"/tools/{llama-bench,batched-bench} "$D/tools/"
cat > "$D/tools/CMakeLists.txt" <<'EOF'
# trimmed by minfer's tools/lcpp_trim.sh: only the two bench tools
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
EOF
for v in ${*:-qwen2}; do cp "$SRC/models/ggml-vocab-$v.gguf" "$D/"; done
tar cJf .lcpp.tar.xz -C "$W" llama.cpp
rm -rf "$W"
ls -la .lcpp.tar.xz
