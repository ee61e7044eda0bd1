#!/usr/bin/env bash
# Installs one of carpool's images into a virtualenv: what its Dockerfile stage runs, and what
# CI runs where no Docker daemon is (tests/images). Run from the repository root.
#
#   scripts/install-image.sh operator|sidecar|model-server VENV
#
# operator and sidecar carry no torch; model-server installs torch first, from TORCH_INDEX
# when set (the CPU or a CUDA wheel index), else as pip finds it. Every other package comes
# at the version the test suite runs with (constraints-dev.txt), installed by uv.
set -euo pipefail
part=${1:?operator, sidecar or model-server}
venv=${2:?the virtualenv to create}
: "${TORCH_VERSION:=2.13.0}"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
case "$part" in
    operator) parts=(./carpool ./operator) ;;
    sidecar) parts=(./carpool ./sidecar) ;;
    # The weights fetcher (`python -m carpool.storage`) runs from the model's image too.
    model-server)
        parts=('./carpool[storage]' './model_server[embedding,vision]')
        # torch first, by pip: a plain `pip install torch` picks CUDA on x86.
        "${pip[@]}" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==$TORCH_VERSION"
        ;;
    *) echo "install-image: unknown part '$part' (operator, sidecar or model-server)" >&2; exit 2 ;;
esac
"${pip[@]}" uv
# --no-sources: the parts come from the paths given, installed, never linked to this folder.
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-sources -c constraints-dev.txt \
    "${parts[@]}"
# uv was only the installer.
"$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" uv
