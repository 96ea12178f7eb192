#!/usr/bin/env bash
# The wheel route of docs/install.md, as a user without root takes it:
#   1. bash scripts/build_wheel.sh (reuses build/python, so after setup.sh it relinks at most);
#   2. a fresh venv (python -m venv, the same Python as .venv, none of its packages), and
#      `pip install dist/relpos-*.whl` in it, offline: NumPy, the wheel's one dependency,
#      from a local folder (downloaded once, the version .venv has);
#   3. proof that the libraries come from the wheel, three ways:
#      a. ldd of the installed extension and of the relpos program: every library that is
#         not part of glibc, libstdc++ or libgcc_s resolves inside the venv's relpos.libs;
#      b. run.py (NumPy attention against a NumPy reference) under LD_DEBUG=libs: the
#         dynamic loader's log shows it initialising libdnnl from relpos.libs and never
#         one from the system; run.py itself checks /proc/self/maps the same way;
#      c. run.py and the relpos program again with the system's copies of the bundled
#         libraries (/usr/lib/x86_64-linux-gnu/libdnnl.so.2.6, ...) made unreadable: in a
#         private mount namespace (unshare, no root needed where user namespaces are
#         allowed) /dev/null is bind-mounted over each, so loading one fails ("file too
#         short"), checked first on libdnnl itself. Nothing is copied from /usr/lib
#         into the venv. Where unshare is not allowed this step is skipped and said so.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash scripts/build_wheel.sh >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheels=(dist/relpos-*.whl)
((${#wheels[@]} == 1)) || { echo "expected one wheel in dist/, found: ${wheels[*]}" >&2; exit 1; }
echo "wheel: ${wheels[0]} ($(du -m "${wheels[0]}" | cut -f1) MB)"

venv=$work/venv
.venv/bin/python -m venv "$venv"  # venv runs .venv's base interpreter: a bare environment
house=build/wheel-test/wheelhouse
numpy=$(.venv/bin/python -c 'import numpy; print(numpy.__version__)')
if ! ls "$house"/numpy-"$numpy"-*.whl >/dev/null 2>&1; then
  .venv/bin/python -m pip download -q --only-binary=:all: --no-deps "numpy==$numpy" -d "$house"
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$house" dist/relpos-*.whl
site=$(realpath "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')")
libs=$site/relpos.libs
ext=("$site"/relpos/_relpos*.so)
test -x "$venv/bin/relpos" && test -x "$site/relpos.scripts/relpos"

# a. ldd: the libraries outside the venv are only the system ones every manylinux wheel may use.
resolved() {  # "name path" for each library ldd resolves, the path without ".." (RPATH is $ORIGIN/../relpos.libs)
  ldd "$1" | while read -r name arrow path _; do
    if [ "$arrow" = "=>" ]; then echo "$name $([ "$path" = not ] && echo NOT-FOUND || realpath -m "$path")"; fi
  done
}
for binary in "${ext[0]}" "$site/relpos.scripts/relpos"; do
  resolved "$binary" >"$work/ldd"
  if grep -q " NOT-FOUND$" "$work/ldd" || ! grep -q "^libdnnl-[0-9a-f]*\.so[.0-9]* $libs/libdnnl-" "$work/ldd"; then
    ldd "$binary"; exit 1
  fi
  foreign=$(awk -v libs="$libs/" 'index($2, libs) != 1 {print $1}' "$work/ldd" |
    grep -Ev '^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so\.[0-9]+$' || true)
  [ -z "$foreign" ] || { echo "resolved outside the wheel: $foreign" >&2; ldd "$binary"; exit 1; }
done
echo "ldd relpos/${ext[0]##*/} (the relpos program alike), the libraries not in glibc, libstdc++ or libgcc_s:"
sed -n "s|^\([^ ]*\) $site/|  \1 => <venv>/site-packages/|p" "$work/ldd"

# b. the loader's log of a NumPy run: libdnnl initialised from relpos.libs, nothing bundled from elsewhere.
LD_DEBUG=libs LD_DEBUG_OUTPUT="$work/ld" "$venv/bin/python" tests/wheel/run.py
sed -n 's/.*calling init: //p' "$work"/ld.* | xargs realpath -m >"$work/init"
grep -q "^$libs/libdnnl-" "$work/init" || { echo "LD_DEBUG: no libdnnl initialised from $libs" >&2; exit 1; }
if grep -E "/lib(dnnl|hwy|gomp|OpenCL)[.-]" "$work/init" | grep -v "^$libs/"; then
  echo "LD_DEBUG: a bundled library initialised from outside the wheel (above)" >&2
  exit 1
fi
echo "LD_DEBUG=libs: initialised from the wheel: $(grep "^$libs/" "$work/init" | xargs -n1 basename | tr '\n' ' ')"
"$venv/bin/relpos" check --length 32 --heads 2 --batch 1 >"$work/cli" || { cat "$work/cli"; exit 1; }

# c. the same with the system's copies of the bundled libraries unreadable.
hide=()
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
for lib in "$libs"/*; do
  stem=$(basename "$lib" | cut -d- -f1)  # libdnnl-<hash>.so.2.6 -> libdnnl
  while read -r path; do hide+=("$(realpath "$path")"); done < <("$ldconfig" -p | awk -v s="$stem.so" 'index($1, s) == 1 {print $NF}')
done
if ((${#hide[@]} == 0)); then
  echo "hidden run: no system copy of the bundled libraries here, nothing to hide"
elif ! unshare -rm true 2>/dev/null; then
  echo "hidden run: skipped, unshare -rm is not allowed here (ldd and LD_DEBUG above still show the wheel's libraries)"
else
  mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u)
  VENV=$venv unshare -rm bash -c '
    set -e
    for f in "$@"; do mount --bind /dev/null "$f"; done
    if "$VENV/bin/python" -c "import ctypes; ctypes.CDLL(\"libdnnl.so.2\")" 2>/dev/null; then
      echo "hidden run: the system libdnnl still loads; hiding failed" >&2; exit 1
    fi
    "$VENV/bin/python" tests/wheel/run.py >/dev/null
    "$VENV/bin/relpos" check --length 32 --heads 2 --batch 1 >/dev/null
  ' hidden "${hide[@]}" || { echo "hidden run failed" >&2; exit 1; }
  echo "hidden run: passed with ${hide[*]} unreadable"
fi
