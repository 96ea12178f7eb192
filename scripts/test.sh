#!/usr/bin/env bash
# The whole test suite: set everything up (see setup.sh), then
#   1. the C++ GoogleTest suite (Release build, build/release),
#   2. the C++ package: install, then the README's C++ example built by an
#      outside project (find_package and add_subdirectory),
#   2b. the wheel (scripts/build_wheel.sh, from build/python) installed into a
#      fresh venv and run with the shared libraries it carries (tests/wheel/check.sh),
#   3. the same suite under AddressSanitizer + UBSan (build/asan, compiled at -O1; the test binary in
#      one process per shard, shards dealt to the cores as they free up),
#   4. a CLI smoke test (check, train, resume, eval, sample, demo),
#   5. the AVX2 stage: a second build for x86-64-v3, its C++ suite (one process per shard) and (on a CPU
#      with AVX-512) the Python suite on it, with oneDNN and torch limited to AVX2,
#   6. the Python suite (pytest) against the installed package.
# The Python suites run in $jobs processes (pytest-xdist), a test file to a process
# (--dist loadfile: a file's shared fixtures, such as the compile check's one run, run once).
# Builds are incremental, so a re-run only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # the venv's cmake and ninja
jobs=$(nproc)

configure_and_build() {  # build-dir, then extra cmake arguments
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DRELPOS_BUILD_TESTS=ON -DRELPOS_BUILD_CLI=OFF "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

# test binary: its tests in 4 x $jobs shards, $jobs at a time, the next started as one ends (GoogleTest's
# sharding deals tests round-robin, so shards differ in time: more of them than cores evens the cores
# out); each shard 40 minutes at most, a failing shard's output shown
sharded_tests() {
  local binary=$1 shards=$((4 * jobs)) logs failed=0 i
  logs=$(mktemp -d)
  for ((i = 0; i < shards; i++)); do
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
    (
      OMP_NUM_THREADS=1 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 2400 "$binary" --gtest_brief=1 \
        >"$logs/$i" 2>&1
      echo $? >"$logs/$i.status"
    ) &
  done
  wait
  for ((i = 0; i < shards; i++)); do
    if [ "$(cat "$logs/$i.status")" = 0 ]; then grep -h "PASSED" "$logs/$i" | sed "s/^/shard $i: /"
    else failed=1; cat "$logs/$i"; fi
  done
  rm -rf "$logs"
  return $failed
}

echo "== C++ tests (Release)"
configure_and_build build/release -DCMAKE_BUILD_TYPE=Release
ctest --test-dir build/release -j "$jobs" --output-on-failure
echo "== C++ package (find_package on the installed tree, add_subdirectory; the README example)"
bash tests/package/check.sh build/release
echo "== Wheel (pip install dist/relpos-*.whl in a fresh venv, its bundled libraries only)"
bash tests/wheel/check.sh
echo "== C++ tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
# The binary's tests run in one process per shard, not one per test as ctest runs them: a sanitized
# process takes ~0.2 s to start and exit, which over 4000 tests was half the stage. ctest runs the rest
# (ForwardTiles_*: tests of the binary again under other forward tiles).
configure_and_build build/asan -DCMAKE_BUILD_TYPE=Debug -DRELPOS_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 sharded_tests build/asan/tests/cpp/relpos_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan -j "$jobs" --output-on-failure -R '^ForwardTiles_'
echo "== CLI smoke test"
.venv/bin/relpos check --length 32 --heads 2 --batch 1 >/dev/null
# train + resume + eval + sample on a tiny model and a generated file (seconds)
smoke=$(mktemp -d)
trap 'rm -rf "$smoke"' EXIT
quiet() { "$@" >"$smoke/log" 2>&1 || { cat "$smoke/log"; return 1; }; }  # output only on failure
.venv/bin/python -c "import sys; sys.stdout.write(''.join(f'line {i}: the quick brown fox {i * i % 97}\\n' for i in range(400)))" >"$smoke/data.txt"
tiny=(--data "$smoke/data.txt" --length 16 --layers 1 --width 32 --heads 2 --ffn 64 --batch 4 --threads 1
  --positions xl --checkpoint "$smoke/xl.ckpt")
# --resume continues exactly: steps 11-20 after a stop at 10 have the losses of one run of 20
quiet .venv/bin/relpos train "${tiny[@]}" --steps 20 --json "$smoke/whole.json" --checkpoint "$smoke/whole.ckpt"
quiet .venv/bin/relpos train "${tiny[@]}" --steps 20 --stop-after 10
quiet .venv/bin/relpos train "${tiny[@]}" --steps 20 --resume --json "$smoke/train.json"
.venv/bin/python -c "import json, sys; w, r = (json.load(open(f'$smoke/{n}.json'))['losses'] for n in ('whole', 'train'))
sys.exit(0 if len(r) == 10 and w[10:] == r else f'resumed losses {r} differ from {w[10:]}')"
# the same with attention dropout: each step's masks come from the step, so a resumed run draws them again
quiet .venv/bin/relpos train "${tiny[@]}" --attention-dropout 0.1 --steps 12 --json "$smoke/whole_d.json" \
  --checkpoint "$smoke/whole_d.ckpt"
quiet .venv/bin/relpos train "${tiny[@]}" --attention-dropout 0.1 --steps 12 --stop-after 6 --checkpoint "$smoke/d.ckpt"
quiet .venv/bin/relpos train "${tiny[@]}" --attention-dropout 0.1 --steps 12 --resume --checkpoint "$smoke/d.ckpt" \
  --json "$smoke/train_d.json"
.venv/bin/python -c "import json, sys; w, r = (json.load(open(f'$smoke/{n}.json'))['losses'] for n in ('whole_d', 'train_d'))
sys.exit(0 if len(r) == 6 and w[6:] == r else f'resumed losses with dropout {r} differ from {w[6:]}')"
quiet .venv/bin/relpos eval --checkpoint "$smoke/xl.ckpt" --multiples 1,2 --threads 1 --json "$smoke/eval.json"
quiet .venv/bin/relpos sample --checkpoint "$smoke/xl.ckpt" --length 20 --threads 1
quiet .venv/bin/relpos demo --data "$smoke/data.txt" --positions alibi,learned --length 8 --layers 1 --width 16 \
  --heads 2 --ffn 32 --steps 5 --batch 2 --multiples 1,2 --out "$smoke/demo"
test -s "$smoke/demo/demo.json" && test -s "$smoke/demo/bits_per_byte.svg"
echo "== AVX2 stage: the C++ and Python suites as an AVX2-only CPU runs them"
# relpos compiled for x86-64-v3 (AVX2 + FMA) with its SIMD dispatch, oneDNN and
# torch limited to AVX2:
# on an AVX-512 machine this runs the code paths of an AVX2 machine (on an AVX2
# machine it runs the suites a second time, on a second build).
# MKL (torch's sgemm) has a limit of its own; on Intel CPUs it runs AVX-512 without it.
avx2=(RELPOS_SIMD=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2)
cmake -S . -B build/avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DRELPOS_MARCH=x86-64-v3 -DRELPOS_BUILD_TESTS=ON \
  -DRELPOS_BUILD_CLI=ON -DRELPOS_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/avx2 -j "$jobs"
# one process per shard, as the sanitizer stage runs them (the Release binary's tests: 49 s on 2 cores, where
# ctest's process per test took 155); the Release stage keeps ctest, so a test that leans on another test's
# state in the same process fails there
(export "${avx2[@]}" && sharded_tests build/avx2/tests/cpp/relpos_tests)
env "${avx2[@]}" ctest --test-dir build/avx2 -j "$jobs" --output-on-failure -R '^ForwardTiles_'
pkg="$PWD/build/avx2/python-package"  # the Python package with the x86-64-v3 extension
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r python/relpos "$pkg/" && cp build/avx2/_relpos*.so "$pkg/relpos/"
test "$(PYTHONPATH="$pkg" .venv/bin/python -c 'import relpos; print(relpos.__file__)')" = "$pkg/relpos/__init__.py"
# Each stage its own inductor cache: a kernel cached under ATEN_CPU_CAPABILITY=avx2
# (8-lane vectors) and reused by an AVX-512 process writes past its buffers (README, Limitations).
# On a CPU without AVX-512 the Python stage below already runs every AVX2 path
# (the same dispatch, the same oneDNN and torch kernels): run it once, there.
if ! grep -qw avx512f /proc/cpuinfo; then
  echo "(no AVX-512 on this CPU: the Python suite runs once, in the next stage)"
else
  env "${avx2[@]}" PYTHONPATH="$pkg" RELPOS_CLI="$PWD/build/avx2/relpos" TORCHINDUCTOR_CACHE_DIR="$PWD/build/avx2/torchinductor" \
    .venv/bin/python -m pytest -q -n "$jobs" --dist loadfile tests/python \
    --ignore=tests/python/test_gpu_compile.py --ignore=tests/python/test_bench_gpu.py \
    --ignore=tests/python/test_gpu.py --ignore=tests/python/test_gpu_ops.py \
    --ignore=tests/python/test_gpu_dropout.py --ignore=tests/python/test_gpu_grid.py \
    --ignore=tests/python/test_context_parallel_gpu.py \
    --ignore=tests/python/test_bench_sam.py --ignore=tests/python/test_bench_fresh.py \
    --ignore=tests/python/test_bench_deberta.py
  # ignored: Triton's kernels (no CPU SIMD in them) and the benches' quick runs, which check that a
  # script runs and writes its table (relpos's numbers in them are the tests' above, at other sizes)
fi
echo "== Python tests"
TORCHINDUCTOR_CACHE_DIR="$PWD/build/release/torchinductor" .venv/bin/python -m pytest -q -n "$jobs" --dist loadfile \
  tests/python
