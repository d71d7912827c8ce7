# bfpsim with CUDA PyTorch.  docker build . -t $(whoami)/bfpsim:latest
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# Dependencies first so code edits do not reinstall them.
COPY pyproject.toml README.md ./
COPY bfp ./bfp
RUN pip install -e ".[test]"
COPY . .
RUN pip install -e . --no-deps
CMD ["python3", "-u", "cifar.py", "--help"]
