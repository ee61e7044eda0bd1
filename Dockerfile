# syntax=docker/dockerfile:1
# carpool's three images, one per part, from one Dockerfile (`make images`):
#
#   ghcr.io/carpool-dev/carpool-operator:0.1.0          PART=operator      no torch
#   ghcr.io/carpool-dev/carpool-sidecar:0.1.0           PART=sidecar       no torch
#   ghcr.io/carpool-dev/carpool-model-server:0.1.0      PART=model-server  CPU torch
#   ghcr.io/carpool-dev/carpool-model-server:0.1.0-cu128                   CUDA 12.8 torch
#
# Each runs `scripts/install-image.sh PART`, the same steps CI runs in a virtualenv per image.
# CUDA wheels bring their own CUDA runtime; the node only needs the NVIDIA driver (570 or newer
# for CUDA 12.8), the container toolkit and the device plugin. BASE swaps the base image.
# checkov:skip=CKV_DOCKER_7: the tag is pinned, through the BASE build argument
# checkov:skip=CKV_DOCKER_2: the kubelet probes each container; one HEALTHCHECK cannot fit all three programs
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG PART=model-server
# The model server's torch: https://download.pytorch.org/whl/<cpu|cu128>.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
WORKDIR /src
COPY scripts/install-image.sh scripts/
COPY constraints-dev.txt ./
COPY carpool ./carpool
COPY sidecar ./sidecar
COPY model_server ./model_server
COPY operator ./operator
# The operator ships the CRD (a link into crds/) to validate models with.
COPY crds ./crds
RUN TORCH_INDEX="${TORCH_INDEX}" TORCH_VERSION="${TORCH_VERSION}" \
    scripts/install-image.sh "${PART}" /opt/carpool

FROM ${BASE}
ARG PART=model-server
LABEL org.opencontainers.image.title="carpool-${PART}" \
      org.opencontainers.image.description="Dynamic request batching for PyTorch model serving" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/carpool /opt/carpool
# The root filesystem is read-only in pods: no bytecode is written, and anything scratch goes
# to the /tmp emptyDir.
ENV PATH=/opt/carpool/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 9091 8081
ENTRYPOINT ["carpool"]
CMD ["--help"]
