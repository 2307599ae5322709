#!/usr/bin/env bash
# uvicorn (uvloop + httptools) vs granian serving the same gateway, same run, alternating.
# A dummy-runtime worker answers, so this measures the gateway and queue path, not a model.
# Needs wrk (Debian package). Usage: perf/asgi/run.sh   (from the repo root)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
V=$ROOT/.venv/bin
WORK=$(mktemp -d)
NPORT=$($V/python -c "from shoal.queue import free_port; print(free_port())")
HPORT=$($V/python -c "from shoal.queue import free_port; print(free_port())")
$V/nats-server -a 127.0.0.1 -p "$NPORT" -js -sd "$WORK/nats" >/dev/null 2>&1 & NP=$!
export SHOAL_NATS__URL=nats://127.0.0.1:$NPORT SHOAL_MODELS_FILE=$ROOT/perf/asgi/models.toml
export SHOAL_WORKER__MODELS=dummy SHOAL_LOG_LEVEL=warning PYTHONPATH=$ROOT/perf/asgi
trap 'kill $NP ${WP:-} ${GP:-} 2>/dev/null || true; rm -rf "$WORK"' EXIT
sleep 0.5
$V/python -m shoal worker >"$WORK/worker.log" 2>&1 & WP=$!
for srv in uvicorn granian uvicorn granian; do
  if [ "$srv" = uvicorn ]; then
    $V/python -m shoal gateway --port "$HPORT" >"$WORK/gw.log" 2>&1 & GP=$!
  else
    $V/granian --interface asgi --factory --loop uvloop --host 127.0.0.1 --port "$HPORT" \
      --workers 1 --no-ws --log-level warning granian_app:factory >"$WORK/gw.log" 2>&1 & GP=$!
  fi
  for _ in $(seq 120); do curl -sf "127.0.0.1:$HPORT/ready" >/dev/null && break; sleep 0.25; done
  wrk -t1 -c16 -d3s -s "$ROOT/perf/asgi/post.lua" "http://127.0.0.1:$HPORT/v1/embeddings" >/dev/null
  echo "== $srv"
  wrk -t1 -c16 -d8s --latency -s "$ROOT/perf/asgi/post.lua" \
    "http://127.0.0.1:$HPORT/v1/embeddings" | grep -E "Requests/sec|50%|99%|Non-2xx"
  kill "$GP"; wait "$GP" 2>/dev/null || true
done
