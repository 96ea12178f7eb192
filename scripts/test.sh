#!/usr/bin/env bash
# The whole test suite: set everything up (see setup.sh), then
#   1. the C++ GoogleTest suite (Release build, build/release),
#   2. the same suite under AddressSanitizer + UBSan (build/asan),
#   3. the Python suite (pytest) against the installed package.
# Builds are incremental, so a re-run only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # the venv's cmake and ninja
jobs=$(nproc)

configure_and_test() {  # build-dir, then extra cmake arguments
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DRELPOS_BUILD_TESTS=ON -DRELPOS_BUILD_CLI=OFF "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure
}

echo "== C++ tests (Release)"
configure_and_test build/release -DCMAKE_BUILD_TYPE=Release
echo "== C++ tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  configure_and_test build/asan -DCMAKE_BUILD_TYPE=Debug -DRELPOS_SANITIZE=ON
echo "== CLI smoke test"
.venv/bin/relpos demo --length 32 --heads 2 --batch 1 >/dev/null
echo "== Python tests"
.venv/bin/python -m pytest -q tests/python
