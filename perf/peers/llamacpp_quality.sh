#!/usr/bin/env bash
# llama.cpp's own quality figures for the built-in SmolLM2 (issue #39): `llama-perplexity
# --kl-divergence` of the shipped Q4_1 file and of F16, Q8_0 and Q4_K_M files made from it
# with llama.cpp's llama-quantize (perf/peers/llamacpp.py: the files `perf bakeoff`'s
# llamacpp-np<N>-<TYPE> and shoal-gguf-<TYPE> targets serve), each against an F32 GGUF of
# the shipped file: its Q4_1 values exactly, in float32 arithmetic, the reference Shoal's
# guard uses. Scored on the token sequences `python -m perf weight-quality` scores
# (perf/data, half chat-templated, >= 20k tokens); llama.cpp scores the second half of each
# 512-token chunk. Each summary lands in $WORK/kl-<TYPE>.txt.
#   bash perf/peers/llamacpp_quality.sh [WORKDIR]   (default /tmp/llamacpp-quality)
# THREADS threads (default 1) at nice 19: about 3 minutes a file on one core of the Xeon VM.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-/tmp/llamacpp-quality}
THREADS=${THREADS:-1}
mkdir -p "$WORK"
# the binaries' directory, then each type's file (made once in the cache dir)
mapfile -t FOUND < <(.venv/bin/python - <<'PY'
import sys
sys.path.insert(0, ".")
from perf.peers.llamacpp import bin_dir, gguf_of_type
print(bin_dir())
for kind in ("F32", "F16", "Q8_0", "Q4_K_M", "Q4_1"):
    print(f"{kind}={gguf_of_type(kind)}")
PY
)
BIN=${FOUND[0]}
declare -A FILE
for entry in "${FOUND[@]:1}"; do FILE[${entry%%=*}]=${entry#*=}; done
.venv/bin/python - "${FILE[Q4_1]}" "$WORK/quality.txt" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from transformers import AutoTokenizer
from perf.weight_quality import _sequences
gguf = Path(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
Path(sys.argv[2]).write_text("\n\n".join(tokenizer.decode(s) for s in _sequences(tokenizer, 20000)))
PY
run() { nice -n 19 "$BIN/llama-perplexity" -f "$WORK/quality.txt" -c 512 -t "$THREADS" "$@"; }
run -m "${FILE[F32]}" --kl-divergence-base "$WORK/base-f32.kld" >"$WORK/F32.log" 2>&1
for kind in F16 Q8_0 Q4_K_M Q4_1; do
  run -m "${FILE[$kind]}" --kl-divergence-base "$WORK/base-f32.kld" --kl-divergence \
    >"$WORK/kl-$kind.log" 2>&1
  sed -n '/====== Perplexity statistics/,$p' "$WORK/kl-$kind.log" >"$WORK/kl-$kind.txt"
  echo "$kind: $(grep -E 'Mean    KLD|Same top p' "$WORK/kl-$kind.txt" | tr -s ' ' | paste -sd ';')"
done
