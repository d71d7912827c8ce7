#!/usr/bin/env bash
# Serve the TensorBoard of every run under ../runs on PORT (default 6006).
#   cd tensorboard && ./run.sh 6006              # http://127.0.0.1:6006/, this machine only
#   ./run.sh 6006 --bind-all                     # every interface: anyone who reaches this host sees the logs
# BFP_TB_BIND_ALL=1 does what --bind-all does; BFP_RUNS=DIR serves DIR instead of ../runs.
# Uses the project's own image (it has TensorBoard; BFP_TB_IMAGE, default $(whoami)/bfpsim:latest,
# as the README builds it) when docker runs and the image is already there (never pulled), and
# BFP_TB_LOCAL is not set; otherwise the local `tensorboard`. Exits 1 when nothing can serve.
set -euo pipefail
PORT=6006
BIND_ALL="${BFP_TB_BIND_ALL:-}"
case "$BIND_ALL" in (""|0|false|False|no) BIND_ALL="";; (*) BIND_ALL=1;; esac
for arg in "$@"; do
  case "$arg" in
    (--bind-all) BIND_ALL=1;;
    (-h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    (*[!0-9]*|'') echo "run.sh: expected PORT (a number) or --bind-all, got '$arg'" >&2; exit 2;;
    (*) PORT="$arg";;
  esac
done
if [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  echo "run.sh: PORT must be in 1..65535, got $PORT" >&2; exit 2
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGDIR="${BFP_RUNS:-$HERE/../runs}"
mkdir -p "$LOGDIR"
LOGDIR="$(cd "$LOGDIR" && pwd)"
if [ -n "$BIND_ALL" ]; then
  HOST_ARGS=(--bind_all); PUBLISH="$PORT:6006"; URL="http://$(hostname):$PORT/ (every interface)"
else
  HOST_ARGS=(--host 127.0.0.1); PUBLISH="127.0.0.1:$PORT:6006"; URL="http://127.0.0.1:$PORT/ (this machine only; --bind-all opens it)"
fi
echo "TensorBoard of $LOGDIR at $URL"
IMAGE="${BFP_TB_IMAGE:-$(whoami)/bfpsim:latest}"
if [ -z "${BFP_TB_LOCAL:-}" ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    # inside the container TensorBoard listens on every interface; -p decides what the host exposes
    if docker run --rm -d --name "bfpsim-tensorboard-$PORT" -p "$PUBLISH" -v "$LOGDIR:/runs:ro" "$IMAGE" \
         tensorboard --logdir /runs --bind_all --port 6006; then
      echo "serving from docker image $IMAGE (stop: docker stop bfpsim-tensorboard-$PORT)"
      exit 0
    fi
    echo "run.sh: docker could not start $IMAGE; trying the local tensorboard" >&2
  else
    echo "run.sh: no docker image $IMAGE here (it is never pulled; build it: docker build . -t $IMAGE," \
         "or set BFP_TB_IMAGE); trying the local tensorboard" >&2
  fi
fi
if command -v tensorboard >/dev/null 2>&1; then
  exec tensorboard --logdir "$LOGDIR" "${HOST_ARGS[@]}" --port "$PORT"
fi
# Checked from / : run from the repository root, its own tensorboard/ folder (this script's) would
# import as a namespace package named tensorboard and pass a check made there.
if (cd / && python3 -c "import tensorboard.main") >/dev/null 2>&1; then
  cd /
  exec python3 -m tensorboard.main --logdir "$LOGDIR" "${HOST_ARGS[@]}" --port "$PORT"
fi
echo "run.sh: nothing can serve TensorBoard: no docker image $IMAGE and no local tensorboard" \
     "(pip install tensorboard, or pip install -e . which brings it)" >&2
exit 1
