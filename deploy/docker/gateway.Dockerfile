# syntax=docker/dockerfile:1
# Shoal's HTTP gateway: the base dependencies only. No torch, no model code runs here.
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t shoal-gateway .
# The gateway refuses a non-loopback bind without API keys: give it SHOAL_AUTH__KEYS
# (or SHOAL_AUTH__KEYS_FILE), or SHOAL_AUTH__ALLOW_UNAUTHENTICATED=1 when something in
# front of it authenticates.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/shoal
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shoal ./shoal
# A regular (not editable) install: the venv holds its own copy of the package, so the
# final stage needs nothing from /src.
RUN /opt/shoal/bin/pip install --no-cache-dir .

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 shoal \
    && useradd --system --no-log-init --uid 10001 --gid 10001 \
        --home-dir /var/lib/shoal --create-home --shell /usr/sbin/nologin shoal
COPY --from=builder /opt/shoal /opt/shoal
ENV PATH=/opt/shoal/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/shoal \
    SHOAL_DATA_DIR=/var/lib/shoal \
    SHOAL_GATEWAY__HOST=0.0.0.0 \
    SHOAL_GATEWAY__PORT=8000
WORKDIR /var/lib/shoal
USER 10001:10001
EXPOSE 8000
# GET /health answers 200 while the process serves; urlopen raises (exit 1) otherwise.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SHOAL_GATEWAY__PORT', '8000'), timeout=4)"]
ENTRYPOINT ["shoal"]
CMD ["gateway"]
