# Sourced by the device scripts (run from the repo root by the device tool): unbuffered Python, a
# `kernelagent` command on PATH (the device machine has the package as a checkout, not installed),
# $OUT made, and `log` for timestamped step headings.
export PYTHONUNBUFFERED=1
mkdir -p .bin && printf '#!/bin/sh\nexec python3 -m kernelagent "$@"\n' > .bin/kernelagent && chmod +x .bin/kernelagent
export PATH="$PWD/.bin:$PATH"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
