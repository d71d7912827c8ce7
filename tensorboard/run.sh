#!/usr/bin/env bash
# Serve the TensorBoard of every run under ../runs on PORT (default 6006).
#   cd tensorboard && ./run.sh 6006
# Uses docker (image tensorflow/tensorflow) when docker is available and
# BFP_TB_LOCAL is not set; otherwise the local `tensorboard` (pip install tensorboard).
set -euo pipefail
PORT="${1:-6006}"
case "$PORT" in (*[!0-9]*|'') echo "run.sh: PORT must be a number, got '$PORT'" >&2; exit 2;; esac
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGDIR="${BFP_RUNS:-$HERE/../runs}"
mkdir -p "$LOGDIR"
LOGDIR="$(cd "$LOGDIR" && pwd)"
if [ -z "${BFP_TB_LOCAL:-}" ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  exec docker run --rm -d --name "bfpsim-tensorboard-$PORT" -p "$PORT:6006" \
    -v "$LOGDIR:/runs:ro" tensorflow/tensorflow:latest \
    tensorboard --logdir /runs --bind_all --port 6006
fi
if command -v tensorboard >/dev/null 2>&1; then
  exec tensorboard --logdir "$LOGDIR" --bind_all --port "$PORT"
fi
exec python3 -m tensorboard.main --logdir "$LOGDIR" --bind_all --port "$PORT"
