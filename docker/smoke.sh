#!/usr/bin/env bash
# Build the project's image and run the seed's commands in it, as a user, not root.
#   docker/smoke.sh            # needs a running Docker daemon (and root for debootstrap, see below)
# 1. The base: BASE (default: the Dockerfile's CUDA PyTorch image) if it is here or can be pulled;
#    otherwise one made from Debian packages: debootstrap (minbase, bookworm, python3 + pip + venv
#    + CA certificates), this host's CA bundle copied in, a venv at /opt/venv first on PATH,
#    imported as bfpsim-base:bookworm.
# 2. docker build with that base (EXTRAS: the package extras, default none on either base;
#    the GPU kernels are Triton's, which CUDA torch brings); prints the build's time and the image's size.
# 3. cifar.py -tc digits_demo, one epoch, as uid 1000 with a mounted runs folder (checks that the
#    run directory is written there, owned by uid 1000); imagenet.py --help.
# The opt-in test tests/test_docker_smoke.py runs it with BFP_DOCKER_SMOKE=1 (never in CI's default run).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${IMAGE:-bfpsim:smoke}"
DEFAULT_BASE="$(sed -n 's/^ARG BASE=//p' Dockerfile)"
BASE="${BASE:-$DEFAULT_BASE}"
LOCAL_BASE="bfpsim-base:bookworm"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

docker info >/dev/null 2>&1 || { echo "smoke.sh: no Docker daemon answers (start dockerd)" >&2; exit 3; }

if docker image inspect "$BASE" >/dev/null 2>&1 || timeout 120 docker pull -q "$BASE" >/dev/null 2>&1; then
  echo "base: $BASE"
  EXTRAS="${EXTRAS-}"
else
  echo "base: $BASE cannot be had here; building $LOCAL_BASE from Debian packages"
  if ! docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "smoke.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 3; }
    ROOTFS="$(mktemp -d)/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
      bookworm "$ROOTFS" "$MIRROR" >/dev/null
    cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
    chroot "$ROOTFS" python3 -m venv /opt/venv
    tar -C "$ROOTFS" -c . | docker import \
      --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$LOCAL_BASE" >/dev/null
    rm -rf "$(dirname "$ROOTFS")"
  fi
  BASE="$LOCAL_BASE"
  EXTRAS="${EXTRAS-}"
fi

start=$(date +%s)
docker build -q --build-arg BASE="$BASE" --build-arg EXTRAS="$EXTRAS" -t "$IMAGE" . >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
echo "built $IMAGE from $BASE in $(( $(date +%s) - start )) s: $(( size / 1000000 )) MB"

RUNS="$(mktemp -d)"
chmod 777 "$RUNS"
docker run --rm --user 1000:1000 -v "$RUNS:/app/runs" "$IMAGE" \
  python3 -u /app/cifar.py -tc digits_demo --training-epochs 1 --num-workers 0 --progress False \
  --log True --run-name smoke | tail -3
owner=$(stat -c %u "$RUNS/smoke/metrics.jsonl")
[ "$owner" = 1000 ] || { echo "smoke.sh: the run was written by uid $owner, not 1000" >&2; exit 1; }
echo "trained one digits epoch as uid 1000; run directory: $RUNS/smoke"
docker run --rm --user 1000:1000 "$IMAGE" python3 imagenet.py --help | head -2
echo "smoke.sh: ok"
