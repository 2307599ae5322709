#!/usr/bin/env bash
# llama.cpp's own quality figures for the built-in SmolLM2 (issue #39): llama-perplexity
# --kl-divergence of the shipped Q4_1 file and of Q8_0 / Q4_K_M files made from it with
# llama-quantize, each against an F16 GGUF of the same weights, on the token sequences
# `python -m perf weight-quality` scores (perf/data, half chat-templated, >= 20k tokens).
#   bash perf/peers/llamacpp_quality.sh [WORKDIR]   (default /tmp/llamacpp-quality)
# The F16, Q8_0 and Q4_K_M files are re-quantized from the Q4_1 file (the only weights
# shipped): the F16 holds the Q4_1 values rounded to f16, so it stands for the float
# reference, and the Q8_0 / Q4_K_M errors are those of a second rounding. SmolLM2's rows
# (576) are not multiples of 256, so llama.cpp's Q4_K_M stores most tensors as Q5_0.
# Last, llama.cpp's own arithmetic on the shipped file against an F32 GGUF of it (the Q4_1
# values exactly, float32 arithmetic): the reference Shoal's guard uses, so the figure
# says how far llama.cpp's kernels (8-bit activations against 4-bit blocks) move answers
# from the weights' exact result.
# One thread at nice 19: about 3 minutes a model on the 2-core Xeon.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash perf/peers/llamacpp_tools.sh >/dev/null
BIN=perf/.venvs/llamacpp-tools/bin
WORK=${1:-/tmp/llamacpp-quality}
mkdir -p "$WORK"
SHIPPED=$(.venv/bin/python -c "from shoal.model_registry import ModelRegistry as R
from shoal.workers.generation.gguf import gguf_file
print(gguf_file(R.from_files().resolve('smollm2-135m-instruct').source))")
.venv/bin/python - "$SHIPPED" "$WORK/quality.txt" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from transformers import AutoTokenizer
from perf.weight_quality import _sequences
gguf = Path(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
Path(sys.argv[2]).write_text("\n\n".join(tokenizer.decode(s) for s in _sequences(tokenizer, 20000)))
EOF
for type in F32 F16 Q8_0 Q4_K_M; do
  nice -n 19 "$BIN/llama-quantize" --allow-requantize "$SHIPPED" "$WORK/$type.gguf" "$type" 2 \
    >"$WORK/quantize-$type.log" 2>&1
done
run() { nice -n 19 "$BIN/llama-perplexity" -f "$WORK/quality.txt" -c 512 -t 1 "$@"; }
run -m "$WORK/F16.gguf" --kl-divergence-base "$WORK/base.kld" >"$WORK/F16.log" 2>&1
for model in "$WORK/Q8_0.gguf" "$WORK/Q4_K_M.gguf" "$SHIPPED"; do
  name=$(basename "$model" .gguf)
  run -m "$model" --kl-divergence-base "$WORK/base.kld" --kl-divergence >"$WORK/kl-$name.log" 2>&1
  echo "$name: $(grep -E 'Mean    KLD|Same top p' "$WORK/kl-$name.log" | tr -s ' ' | paste -sd ';')"
done
run -m "$WORK/F32.gguf" --kl-divergence-base "$WORK/base-f32.kld" >"$WORK/F32.log" 2>&1
run -m "$SHIPPED" --kl-divergence-base "$WORK/base-f32.kld" --kl-divergence \
  >"$WORK/kl-shipped-vs-f32.log" 2>&1
echo "shipped vs F32: $(grep -E 'Mean    KLD|Same top p' "$WORK/kl-shipped-vs-f32.log" \
  | tr -s ' ' | paste -sd ';')"
