# carpool developer commands. `make demo` and `make test` are the README's two set-up commands:
# each installs what it needs on a fresh machine first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PATH := $(CURDIR)/.cache/tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup tools demo test lint typecheck unit bench clean generate images image-cuda grpc constraints

# The four parts of the workspace (pyproject.toml), each installed editable from its folder.
PARTS := carpool sidecar model_server operator
$(STAMP): pyproject.toml $(PARTS:%=%/pyproject.toml) constraints-dev.txt
	python3 -m venv $(VENV)
	# The CPU wheel first, by pip, which finds the machine's local file (uv does not look there):
	# any looser spec pulls gigabytes of CUDA packages. uv then installs the rest in seconds.
	$(PY) -m pip install -qq -c constraints-dev.txt torch==2.13.0 uv
	$(VENV)/bin/uv pip install -q --python $(PY) -c constraints-dev.txt --group dev \
		-e './carpool[all]' -e ./sidecar -e './model_server[embedding,vision]' -e ./operator
	touch $(STAMP)

setup: $(STAMP)

# The gRPC modules beside carpool/src/carpool/contract/oip_grpc/inference.proto, checked in.
# Their messages go in a descriptor pool of their own: tritonclient and kserve define the same
# `inference.*` names in the default pool, and a process may load those too.
GRPC_SRC := carpool/src
GRPC_DIR := $(GRPC_SRC)/carpool/contract/oip_grpc
grpc: setup
	rm -rf build/grpc && mkdir -p build/grpc
	$(PY) -m grpc_tools.protoc -I$(GRPC_SRC) \
		--python_out=build/grpc --grpc_python_out=build/grpc \
		--mypy_out=build/grpc --mypy_grpc_out=build/grpc \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
		--plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
		$(GRPC_DIR)/inference.proto
	cp build/grpc/carpool/contract/oip_grpc/inference_pb2* $(GRPC_DIR)/
	sed -i 's/_descriptor_pool.Default().AddSerializedFile/_descriptor_pool.DescriptorPool().AddSerializedFile/' \
		$(GRPC_DIR)/inference_pb2.py

tools:
	scripts/install-tools.sh

# The main job: model server and sidecar as two processes with MiniLM, then a short load.
demo: setup
	$(VENV)/bin/carpool serve --handler text-embedding --demo-load

# What the knob table (carpool/src/carpool/contract/batching.py) defines in other files: the
# CRD's spec.batching, the chart's defaults and their schema, the docs' knob tables.
generate: setup
	$(PY) -m carpool.contract.generate

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	# The layering of carpool's packages (pyproject.toml, [tool.importlinter]).
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

# The suite mostly waits on the processes it starts, so three workers share the two cores of
# CI well; a file's tests stay on one worker, sharing its module fixtures. Tests marked serial
# assert bounds of a few seconds: they run afterwards, alone.
unit: setup tools
	$(VENV)/bin/pytest -q -n 3 --dist loadfile -m 'not serial'
	$(VENV)/bin/pytest -q -m serial

# Lint and the type check run while the tools download; the tests start once the CPU is free.
test:
	$(MAKE) -j2 --output-sync=target lint typecheck tools
	$(MAKE) unit

bench: setup
	$(PY) bench/compare.py

# The images the chart refers to, one per part, from the one Dockerfile (PART=...): the
# operator and the sidecar without torch, the model server on CPU torch and on CUDA torch.
# CUDA names a torch wheel index that serves the pinned torch
# (https://download.pytorch.org/whl/<CUDA>); the chart's images.modelServerCuda.tagSuffix and
# the operator's DEFAULT_CUDA_IMAGE carry the same tag.
IMAGE ?= ghcr.io/carpool-dev/carpool
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' carpool/pyproject.toml)
CUDA ?= cu128
DOCKER ?= docker

images:
	$(DOCKER) build --build-arg PART=operator -t $(IMAGE)-operator:$(VERSION) .
	$(DOCKER) build --build-arg PART=sidecar -t $(IMAGE)-sidecar:$(VERSION) .
	$(DOCKER) build --build-arg PART=model-server \
		--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
		-t $(IMAGE)-model-server:$(VERSION) .

image-cuda:
	$(DOCKER) build --build-arg PART=model-server \
		--build-arg TORCH_INDEX=https://download.pytorch.org/whl/$(CUDA) \
		-t $(IMAGE)-model-server:$(VERSION)-$(CUDA) .

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
