#!/usr/bin/env bash
# The GPU check on the air-gapped H200 in one call of the device tool (benchmarks/README.md, "The GPU check"):
#
#     run  command="bash benchmarks/gpu_run.sh"  carry=[".gpu-bundle"]  timeout_s=570
#
# 1. Installs what the image lacks from .gpu-bundle/ (built here by `make gpu-bundle`) into the image's python, with no
#    index (pip keeps every installed package that satisfies a requirement), and prints what it installed or changed;
#    if site-packages cannot be written (or GPU_INSTALL_TARGET=DIR is set), into /tmp/gpu-site (or DIR) on PYTHONPATH.
# 2. Runs benchmarks/gpu_check.py (its own time budget: 480 s by default on a GPU), writing gpu_check.{json,md}.
# 3. Copies gpu_check.{json,md}, install.log and check.log to $OUT (what the device tool brings back).
# Extra arguments go to gpu_check.py, e.g. `bash benchmarks/gpu_run.sh --sections zero3,split_lora`.
# `make gpu-rehearsal` runs this same script on CPU: PYTHON=<its virtualenv>, GPU_CHECK_ARGS=--rehearse,
# GPU_EXTRA_WHEELS=<the CPU interpreter's builds of the bundle's compiled wheels>, GPU_RESULTS=<a scratch folder>.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUNDLE=${GPU_BUNDLE:-.gpu-bundle}
RESULTS=${GPU_RESULTS:-benchmarks/results/gpu}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
start=$(date +%s)
if [ ! -f "$BUNDLE/requirements.txt" ]; then
  echo "gpu_run: $BUNDLE/requirements.txt is missing: run 'make gpu-bundle' here and carry $BUNDLE" >&2
  exit 2
fi
mkdir -p "$RESULTS"
echo "== $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])'); bundle: $(ls "$BUNDLE" | wc -l) files"
freeze() { $PY -m pip freeze --all 2>/dev/null | sort; }
before=$(freeze)
find_links=(--find-links "$BUNDLE")
[ -n "${GPU_EXTRA_WHEELS:-}" ] && find_links+=(--find-links "$GPU_EXTRA_WHEELS")
# hermetic: no pip configuration or PIP_* variable of the machine adds an index or a wheel folder
nopip=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null)
pip_install() { "${nopip[@]}" $PY -m pip install --no-index --no-compile "${find_links[@]}" "$@"; }
site=${GPU_INSTALL_TARGET:-}  # set: install into that folder (on PYTHONPATH) instead of the image's site-packages
if [ -z "$site" ]; then
  pip_install -r "$BUNDLE/requirements.txt" 2>&1 | tee "$RESULTS/install.log"
  install_rc=${PIPESTATUS[0]}
  # pacs (the distribution trl-pacs) from the bundle even when the same version is installed already (a warm
  # machine, an earlier run)
  [ "$install_rc" = 0 ] && pip_install -q --no-deps --force-reinstall "$(grep '^trl-pacs==' "$BUNDLE/requirements.txt")" \
    2>&1 | tee -a "$RESULTS/install.log"
  if [ "$install_rc" != 0 ] && grep -qiE "permission denied|read-only file system" "$RESULTS/install.log"; then
    site=/tmp/gpu-site  # the image's site-packages cannot be written: the fallback below
  fi
fi
if [ -n "$site" ]; then
  # resolve against the image (a dry run writes nothing), then put exactly the wheels pip chose into $site, which
  # PYTHONPATH puts ahead of the image's site-packages (so a changed version, e.g. fsspec, wins)
  echo "== installing into $site (PYTHONPATH)" | tee -a "$RESULTS/install.log"
  pip_install -q --dry-run --report "$RESULTS/install-report.json" -r "$BUNDLE/requirements.txt" 2>&1 \
    | tee -a "$RESULTS/install.log"
  mapfile -t wheels < <($PY -c 'import json, sys, urllib.parse as u
for i in json.load(open(sys.argv[1]))["install"]: print(u.unquote(u.urlparse(i["download_info"]["url"]).path))' \
    "$RESULTS/install-report.json")
  pip_install --no-deps --upgrade --target "$site" "${wheels[@]}" 2>&1 | tee -a "$RESULTS/install.log"
  install_rc=${PIPESTATUS[0]}
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
after=$(freeze)
echo "== installed from $BUNDLE (new or changed):" | tee -a "$RESULTS/install.log"
diff <(echo "$before") <(echo "$after") | grep '^[<>]' | tee -a "$RESULTS/install.log"
$PY -m pip check 2>&1 | tee -a "$RESULTS/install.log"
echo "== install: $(( $(date +%s) - start )) s, pip exit $install_rc"
if [ "$install_rc" != 0 ]; then
  echo "gpu_run: the install from $BUNDLE failed (above): a wheel is missing or clashes with the image" >&2
  [ -n "${OUT:-}" ] && cp "$RESULTS/install.log" "$OUT"/
  exit 3
fi
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of words
$PY -m benchmarks.gpu_check --out-dir "$RESULTS" ${GPU_CHECK_ARGS:-} "$@" 2>&1 | tee "$RESULTS/check.log"
check_rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  for f in gpu_check.json gpu_check.md install.log check.log; do [ -f "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT"/; done
fi
echo "== gpu_run: $(( $(date +%s) - start )) s in all, gpu_check.py exit $check_rc"
exit "$check_rc"
