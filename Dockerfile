# bfpsim with CUDA PyTorch (the README's "On a GPU" and Docker sections):
#   docker build . -t $(whoami)/bfpsim:latest
#   docker run --rm --gpus all -v "$(pwd)/runs":/app/runs $(whoami)/bfpsim:latest python3 cifar.py --bfp ResNet18_FB24
# The GPU kernels are Triton's, which the image's PyTorch brings (with its own ptxas); the devel
# image has the C compiler Triton's launchers and torch.compile's Inductor build with.
# BASE: any image with python3 and pip on PATH (docker/smoke.sh builds one from Debian packages
# where the default cannot be pulled).
ARG BASE=pytorch/pytorch:2.9.0-cuda12.8-cudnn9-devel
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    BFP_IMAGENET_DIR=/dataset/imagenet \
    TORCH_HOME=/app/.torch
WORKDIR /app
COPY . .
# Installed as a wheel is (not editable): the image holds every package it ships. A working tree
# mounted over /app (`docker run -v "$(pwd)":/app`) still runs its own scripts and bfp/ first.
ARG EXTRAS=
RUN pip install --no-cache-dir "./${EXTRAS:+[$EXTRAS]}" \
    && useradd --create-home --uid 1000 --user-group bfp \
    && mkdir -p /app/runs /app/data /app/.torch /dataset \
    && chown -R bfp:bfp /app/runs /app/data /app/.torch
# bfp (uid 1000); the seed's `docker run --user "$(id -u):$(id -g)"` replaces it with yours.
USER 1000:1000
# Runs (logs, TensorBoard events, checkpoints) and datasets live outside the image.
VOLUME ["/app/runs", "/dataset"]
CMD ["python3", "-u", "imagenet.py", "--help"]
