#!/usr/bin/env bash
# The installed package, as a user gets it (`make test-installed`, run by .ci/run): the wheel built from this checkout,
# installed (not editable) into a fresh virtualenv and used from a directory outside the checkout:
#   pacs --help, python -m pacs --help, pacs recipes; pacs plan --config qwen3_4b_pacs (exit 0, the shipped recipe by
#   name with the accelerate config it names); the same on --num_processes 1 (refused, naming the fix); a 2-step
#   pacs train on the tiny model; a tiny pacs eval.
# The virtualenv reuses the dependencies already installed (--system-site-packages) and gets the wheel alone
# (--no-deps; --ignore-installed, as the checkout is installed editable under the same name): the point is the package
# as built (its files, package data, entry point), not the resolver. The editable install cannot shadow it: its path
# entry (a .pth in the system site-packages) comes after the virtualenv's site-packages, and the script checks that
# `pacs` is imported from the virtualenv. About a minute on 2 CPU cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pacs-installed.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
step() { echo "== [$(( $(date +%s) - start )) s] $*"; }

step "the wheel"
# from a clean copy of what the wheel is built from: setuptools' in-tree build/ would otherwise keep (and ship) files
# deleted from src/ since an earlier build
mkdir "$WORK/tree" && cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$ROOT/src" "$WORK/tree/"
find "$WORK/tree/src" \( -name "*.egg-info" -o -name __pycache__ \) -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/tree"
wheel=$(ls "$WORK"/dist/trl_pacs-*.whl)  # the distribution trl-pacs; wheel names normalize to trl_pacs-...
step "a fresh virtualenv with $(basename "$wheel")"
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
PIP_CONFIG_FILE=/dev/null "$WORK/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed "$wheel"
export PATH="$WORK/venv/bin:$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
unset PYTHONPATH
cd "$WORK"  # outside the checkout: nothing may come from it
python - <<'PY'
import importlib.metadata, sys

import pacs
import pacs.recipes

assert pacs.__file__.startswith(sys.prefix), f"pacs imported from {pacs.__file__}, not the virtualenv {sys.prefix}"
assert importlib.metadata.version("trl-pacs") == pacs.__version__
print(f"pacs {pacs.__version__} from {pacs.__file__}; recipes in {pacs.recipes.RECIPES_DIR}")
PY

step "pacs --help, python -m pacs --help, pacs recipes"
pacs --help > help.txt && grep -q "train" help.txt
python -m pacs --help > /dev/null
# to a file first: `grep -q` in a pipeline exits at its first match, and under pipefail the writer's SIGPIPE (141) fails
pacs recipes > recipes.txt && cat recipes.txt && grep -q "qwen3_4b_pacs .*accelerate config zero3" recipes.txt

step "pacs plan --config qwen3_4b_pacs (exit 0)"
pacs plan --config qwen3_4b_pacs > plan.txt 2> plan.log || { cat plan.txt plan.log; exit 1; }
grep -q "DeepSpeed ZeRO-3 (accelerate config zero3)" plan.txt && grep -q "^Problems: none" plan.txt

step "pacs plan --config qwen3_4b_pacs --num_processes 1 (refused, naming the fix)"
if pacs plan --config qwen3_4b_pacs --num_processes 1 > refused.txt 2>&1; then
  echo "pacs plan accepted 1 process for an 8-process recipe"; cat refused.txt; exit 1
fi
grep "ERROR \[expected_world_size\]" refused.txt
grep -q -- "--gradient_accumulation_steps 256 --steps_per_generation 1024 --expected_world_size 1" refused.txt

step "pacs train: the tiny model, 2 steps"
python -c "from pacs.testing import build_tiny_model; build_tiny_model('tiny-model')"
pacs train --config tiny_cpu --model_name_or_path tiny-model --output_dir run --max_steps 2 --eval_strategy no \
  > train.log 2>&1 || { tail -50 train.log; exit 1; }
test -f run/model.safetensors && grep -q "train_runtime" train.log

step "pacs eval: the tiny model, 1 benchmark, 2 problems x 2 samples"
pacs eval --model tiny-model --benchmarks aime24 --n 2 --limit 2 --max_new_tokens 8 --output_dir eval --no_progress \
  > eval.log 2>&1 || { tail -50 eval.log; exit 1; }
test -f eval/eval_metrics.json

step "the installed package works outside the checkout"
