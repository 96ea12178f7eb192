#!/usr/bin/env bash
# The C++ package test: a newcomer's path through the README, run as written.
#   1. The README's install commands (its ```bash block with `cmake --install`),
#      run line by line from the repository root, with HOME pointing at a scratch
#      folder so that "$HOME/.local" is a throw-away prefix.
#   2. The README's C++ quick start: its ```cpp block as main.cpp, its ```cmake
#      block as CMakeLists.txt, then its ```bash block that builds them, run as
#      written in that folder; the program's output is checked against the
#      semantics (causal row 0 sees key 0 only, so out[0] = v[0]).
#   3. The same example through tests/package/CMakeLists.txt, a C++17 consumer,
#      once through find_package on the installed tree (RelWithDebInfo) and once
#      through add_subdirectory with no build type: relpos must leave the
#      parent's build type alone and still compile its own sources optimised.
# Usage: tests/package/check.sh [BUILD_DIR]. BUILD_DIR (default build/release)
# must be the folder the README's commands build in: scripts/test.sh passes the
# tree its C++ stage has just built, so the README's build command finds
# nothing left to do there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
readme="$root/README.md"
build_dir=${1:-build/release}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

block() {  # block LANG PATTERN: the first ```LANG block of the README that contains PATTERN
  python3 - "$readme" "$1" "$2" <<'PY'
import re, sys
text, lang, pattern = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
for body in re.findall(r"^```" + re.escape(lang) + r"\n(.*?)^```$", text, re.S | re.M):
    if pattern in body:
        sys.stdout.write(body)
        sys.exit(0)
sys.exit(f"README.md has no ```{lang} block containing {pattern!r}")
PY
}
run_logged() {  # run_logged LOG COMMAND...: quiet unless it fails
  "${@:2}" >"$1" 2>&1 || { cat "$1"; echo "check.sh: failed: ${*:2}" >&2; exit 1; }
}
check_out_row() {  # the example prints out[0], which must equal v[0] as the example fills it
  python3 - "$1" <<'PY'
import math, sys
lines = open(sys.argv[1]).read().split("\n")
row = [float(x) for x in lines[0].split(":")[1].split()]
want = [math.cos(0.37 * i) for i in range(len(row))]
err = max(abs(a - b) for a, b in zip(row, want))
sys.exit(0 if len(row) == 16 and err < 1e-5 else f"out[0] = {row}, expected v[0] = {want}")
PY
}

# 1. Install, exactly as the README says.
block bash "cmake --install" >"$work/install.sh"
grep -q -- "-B $build_dir " "$work/install.sh" ||
  { echo "check.sh: the README's install commands do not build in $build_dir:" >&2; cat "$work/install.sh" >&2; exit 1; }
mkdir -p "$work/home"
(cd "$root" && run_logged "$work/install.log" env HOME="$work/home" bash -euxo pipefail "$work/install.sh")
prefix="$work/home/.local"
test -f "$prefix/lib/cmake/relpos/relposConfig.cmake"
test -f "$prefix/include/relpos/attention.hpp"
echo "C++ package: the README's install commands ran as written"

# 2. The README's C++ quick start, as written.
mkdir -p "$work/app"
block cpp "attention_forward" >"$work/app/main.cpp"
block cmake "find_package(relpos" >"$work/app/CMakeLists.txt"
block bash "./build/app" >"$work/app/build.sh"
(cd "$work/app" && run_logged "$work/app.log" env HOME="$work/home" bash -euxo pipefail "$work/app/build.sh")
sed -n '/^out\[0\]:/p' "$work/app.log" >"$work/app/out.txt"
check_out_row "$work/app/out.txt"
echo "C++ package: the README's C++ quick start built against the install and checked"

# 3. A C++17 consumer, both ways.
for from in package subdirectory; do
  mkdir -p "$work/$from"
  # A subproject must leave the parent's build type as it is, set or not.
  build_type=$([ $from = package ] && echo RelWithDebInfo || echo "")
  cp "$work/app/main.cpp" "$work/$from/readme_example.cpp"
  run_logged "$work/$from.log" cmake -S "$root/tests/package" -B "$work/$from" -G Ninja -DRELPOS_FROM=$from \
    -DCMAKE_BUILD_TYPE="$build_type" -DRELPOS_SOURCE="$root" -DCMAKE_PREFIX_PATH="$prefix"
  if [ $from = subdirectory ]; then
    # No build type in the parent: relpos's own sources still get the Release flags.
    ninja -C "$work/$from" -t commands readme_example | grep -F -- "-c $root/src/" >"$work/relpos_compiles.txt" || true
    test -s "$work/relpos_compiles.txt" && ! grep -v -- " -O3 " "$work/relpos_compiles.txt" ||
      { echo "check.sh: add_subdirectory with no build type compiles relpos's sources without -O3" >&2; exit 1; }
  fi
  run_logged "$work/$from.build.log" cmake --build "$work/$from"
  "$work/$from/readme_example" >"$work/$from/out.txt"
  check_out_row "$work/$from/out.txt"
  echo "C++ package ($from): README example built and checked"
done
