#!/usr/bin/env bash
# The C++ package test: install relpos from a configured build tree, then
# build the README's C++ example in an outside project, once through
# find_package on the installed tree and once through add_subdirectory, and
# check what it prints against the semantics (causal row 0 sees key 0 only, so
# out[0] = v[0]). Usage: tests/package/check.sh BUILD_DIR (a configured and built relpos tree).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/lib/cmake/relpos/relposConfig.cmake"

for from in package subdirectory; do
  mkdir -p "$work/$from"
  # A subproject must leave the parent's build type as it is, set or not.
  build_type=$([ $from = package ] && echo RelWithDebInfo || echo "")
  # The first ```cpp block of the README, as written.
  awk '/^```cpp$/ {on = 1; next} /^```$/ && on {exit} on' "$root/README.md" >"$work/$from/readme_example.cpp"
  cmake -S "$root/tests/package" -B "$work/$from" -G Ninja -DRELPOS_FROM=$from -DCMAKE_BUILD_TYPE="$build_type" -DRELPOS_SOURCE="$root" \
    -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/$from.log" 2>&1 || { cat "$work/$from.log"; exit 1; }
  cmake --build "$work/$from" >>"$work/$from.log" 2>&1 || { cat "$work/$from.log"; exit 1; }
  "$work/$from/readme_example" >"$work/$from/out.txt"
  python3 - "$work/$from/out.txt" <<'PY'
import math, sys
lines = open(sys.argv[1]).read().split("\n")
row = [float(x) for x in lines[0].split(":")[1].split()]
want = [math.cos(0.37 * i) for i in range(len(row))]  # v[0], as the example fills it
err = max(abs(a - b) for a, b in zip(row, want))
sys.exit(0 if len(row) == 16 and err < 1e-5 else f"out[0] = {row}, expected v[0] = {want}")
PY
  echo "C++ package ($from): README example built and checked"
done
