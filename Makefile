# carpool developer commands. `make demo` and `make test` are the README's two set-up commands:
# each installs what it needs on a fresh machine first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONSAFEPATH := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PATH := $(CURDIR)/.cache/tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup link tools demo test lint typecheck unit bench clean crd image image-cuda grpc constraints

$(STAMP): pyproject.toml constraints-dev.txt
	python3 -m venv $(VENV)
	# The CPU wheel first, by pip, which finds the machine's local file (uv does not look there):
	# any looser spec pulls gigabytes of CUDA packages. uv then installs the rest in seconds.
	$(PY) -m pip install -qq -c constraints-dev.txt torch==2.13.0 uv
	$(VENV)/bin/uv pip install -q --python $(PY) -c constraints-dev.txt -e '.[dev]' \
		--config-settings editable_mode=strict
	touch $(STAMP)

setup: $(STAMP)

# The strict editable install is a tree of links: re-link it so files added since setup count.
link: setup
	$(PY) -m pip install -qq --no-deps --no-build-isolation -e . --config-settings editable_mode=strict

# The gRPC modules beside sidecar/grpc/inference.proto, checked in. The proto is mapped to
# its import path so the generated modules import each other as carpool.sidecar.grpc.*.
# Its messages go in a descriptor pool of their own: tritonclient and kserve define the same
# `inference.*` names in the default pool, and a process may load those too.
GRPC_DIR := sidecar/grpc
grpc: setup
	rm -rf build/grpc && mkdir -p build/grpc
	$(PY) -m grpc_tools.protoc -Icarpool/sidecar/grpc=$(GRPC_DIR) \
		--python_out=build/grpc --grpc_python_out=build/grpc \
		--mypy_out=build/grpc --mypy_grpc_out=build/grpc \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
		--plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
		carpool/sidecar/grpc/inference.proto
	cp build/grpc/carpool/sidecar/grpc/inference_pb2* $(GRPC_DIR)/
	sed -i 's/_descriptor_pool.Default().AddSerializedFile/_descriptor_pool.DescriptorPool().AddSerializedFile/' \
		$(GRPC_DIR)/inference_pb2.py

tools:
	scripts/install-tools.sh

# The main job: model server and sidecar as two processes with MiniLM, then a short load.
demo: link
	$(VENV)/bin/carpool serve --handler text-embedding --demo-load

# The CRD's spec.batching schema, written from carpool/contract/batching.py (the chart links it).
crd: link
	$(PY) -m carpool.contract.crd crds/batchedmodels.carpool.dev.yaml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: link
	$(VENV)/bin/mypy -p carpool -p carpool.model_server -p carpool.sidecar -p carpool.operator

# The suite mostly waits on the processes it starts, so three workers share the two cores of
# CI well; a file's tests stay on one worker, sharing its module fixtures. Tests marked serial
# assert bounds of a few seconds: they run afterwards, alone.
unit: link tools
	$(VENV)/bin/pytest -q -n 3 --dist loadfile -m 'not serial'
	$(VENV)/bin/pytest -q -m serial

# Lint and the type check run while the tools download; the tests start once the CPU is free.
test:
	$(MAKE) -j2 --output-sync=target lint typecheck tools
	$(MAKE) unit

bench: setup
	# A script's own folder (bench/) goes first on sys.path only without PYTHONSAFEPATH.
	env -u PYTHONSAFEPATH $(VENV)/bin/python bench/compare.py

# The two images the chart refers to (images.modelServer, images.modelServerCuda): the same
# Dockerfile on CPU torch and on CUDA torch. CUDA names a torch wheel index that serves the
# pinned torch (https://download.pytorch.org/whl/<CUDA>); the chart's
# images.modelServerCuda.tagSuffix and the operator's DEFAULT_CUDA_IMAGE carry the same tag.
IMAGE ?= ghcr.io/carpool-dev/carpool
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CUDA ?= cu128
DOCKER ?= docker

image:
	$(DOCKER) build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
		-t $(IMAGE):$(VERSION) .

image-cuda:
	$(DOCKER) build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/$(CUDA) \
		-t $(IMAGE):$(VERSION)-$(CUDA) .

# The resolved versions of '.[dev]' for this Python, torch pinned to the CPU wheel CI installs
# (its CUDA packages left out: the CPU wheel needs none). uv resolves in seconds.
constraints: setup
	echo torch==2.13.0 > $(VENV)/torch-pin.txt
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -c $(VENV)/torch-pin.txt --no-header \
		--no-annotate -q -o $(VENV)/resolved.txt
	{ sed -n '1,3p' constraints-dev.txt; grep -vE '^(cuda-|nvidia-|triton==)' $(VENV)/resolved.txt; } \
		> constraints-dev.txt.new && mv constraints-dev.txt.new constraints-dev.txt

clean:
	rm -rf $(VENV) .cache build *.egg-info
