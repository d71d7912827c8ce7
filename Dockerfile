# bfpsim with CUDA PyTorch:  docker build . -t $(whoami)/bfpsim:latest
# devel, not runtime: Numba's CUDA kernels need the toolkit's NVVM/libdevice.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY . .
# Editable: the README's `docker run -v "$(pwd)":/app` mounts the working tree over /app.
RUN pip install -e ".[test,cuda]"
CMD ["python3", "-u", "cifar.py", "--help"]
