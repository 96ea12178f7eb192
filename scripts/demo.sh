#!/usr/bin/env bash
# The main job: set everything up (see setup.sh), then run `relpos demo`
# (train one small language model per position scheme, evaluate at 1x..16x).
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --length 256`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/relpos demo "$@"
