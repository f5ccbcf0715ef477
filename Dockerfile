# syntax=docker/dockerfile:1
# One image for every Tessera component: `tessera operator | extender | gateway | simulate` and `tessera-agent`.
#   docker build -t tessera:0.1.0 .
# The image runs as an unprivileged user. The node agent's DaemonSet overrides this (runAsUser 0, privileged):
# the kubelet's device-plugin directory is root-only and nvidia-cuda-mps-control sets GPU compute modes.

# ---- build: wheels for Tessera and its dependencies ------------------------------------------------------
FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY device-plugin/ device-plugin/
RUN python -m venv /opt/tessera \
 && /opt/tessera/bin/pip install .

# ---- runtime ------------------------------------------------------------------------------------------------
FROM python:3.11.13-slim-bookworm
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Fair, fractional GPU scheduling for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tessera \
 && useradd --system --uid 10001 --gid tessera --home-dir /home/tessera --create-home tessera
COPY --from=build /opt/tessera /opt/tessera
ENV PATH=/opt/tessera/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/tessera
# Kubernetes ignores image health checks; the chart declares liveness/readiness probes per component.
HEALTHCHECK NONE
CMD ["tessera", "--help"]
