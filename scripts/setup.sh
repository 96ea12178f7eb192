#!/usr/bin/env bash
# Installs what relpos needs on a fresh Debian 12 machine and builds it:
# Debian packages with apt, Python packages in the project venv .venv, then
# `pip install .` (the extension module and the relpos command). Re-running
# it only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(g++ libgtest-dev libdnnl-dev libhwy-dev libcli11-dev nlohmann-json3-dev fortunes)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
# torch first and pinned (CPU build): an unpinned torch pulls in CUDA packages.
# transformers: the tests of relpos.torch.patch_hf_t5 run against it (tiny random models, no downloads).
# pytest-xdist: the Python suites in one process per core (scripts/test.sh).
# ml_dtypes: NumPy's bfloat16 dtype, for the tests of bfloat16 NumPy arrays.
# triton: relpos.gpu's kernels; here they run in its interpreter and compile to GPU code without a GPU.
REQS="torch==2.13.0 numpy pytest pytest-xdist==3.8.0 nanobind scikit-build-core cmake ninja transformers==5.23.0 ml_dtypes==0.6.0 triton==3.9.0"
stamp=.venv/.relpos-requirements
if [ "$(cat "$stamp" 2>/dev/null)" != "$REQS" ]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q $REQS
  echo "$REQS" > "$stamp"
fi

echo "setup: building relpos (pip install .)"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps .
