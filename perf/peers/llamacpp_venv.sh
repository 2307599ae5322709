#!/usr/bin/env bash
# llama-cpp-python's OpenAI-compatible server in its own venv (perf/.venvs/llamacpp): the
# peer a CPU chat user would pick. PyPI ships only its source, so this builds llama.cpp
# (about 10 minutes on 2 cores; needs cmake and a C++ compiler).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=perf/.venvs/llamacpp
[ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null && exit 0
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$VENV/bin/python" -m pip install --quiet \
  "llama-cpp-python[server]==0.3.36"
