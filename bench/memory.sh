#!/usr/bin/env bash
# Memory and time of every scheme x algorithm over L = 256 ... 8192:
# sets everything up, then runs `relpos bench memory` (extra arguments go to it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/relpos bench memory "$@"
