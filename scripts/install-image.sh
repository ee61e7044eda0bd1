#!/usr/bin/env bash
# Installs one of carpool's images into a virtualenv: what its Dockerfile stage runs, and what
# CI runs where no Docker daemon is (tests/images). Run from the repository root.
#
#   scripts/install-image.sh operator|sidecar|model-server VENV
#
# operator and sidecar carry no torch; model-server installs torch first, from TORCH_INDEX
# when set (the CPU or a CUDA wheel index), else from pip's own configuration.
set -euo pipefail
part=${1:?operator, sidecar or model-server}
venv=${2:?the virtualenv to create}
: "${TORCH_VERSION:=2.13.0}"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check)
case "$part" in
    operator) "${pip[@]}" ./carpool ./operator ;;
    sidecar) "${pip[@]}" ./carpool ./sidecar ;;
    model-server)
        # torch first: a plain `pip install torch` picks CUDA on x86.
        "${pip[@]}" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==$TORCH_VERSION"
        # The weights fetcher (`python -m carpool.storage`) runs from this image too.
        "${pip[@]}" './carpool[storage]' './model_server[embedding]'
        ;;
    *) echo "install-image: unknown part '$part' (operator, sidecar or model-server)" >&2; exit 2 ;;
esac
