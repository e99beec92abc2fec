#!/usr/bin/env bash
# Issue 59: does this machine's Python have bytecode for torch, and may it write it? A process
# that cannot write __pycache__ (a read-only install, PYTHONDONTWRITEBYTECODE, a jailed view)
# compiles every module it imports from source, every time. Prints the facts, then times
# `import torch._inductor` in two fresh processes; with COMPILE=1 it then byte-compiles the
# installation as `pip install` does (python -m compileall) and times the imports again.
#   [COMPILE=1] bash scripts/device/bytecode_probe.sh
set -u
. "$(dirname "$0")/env.sh"
SITE=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
log "site-packages $SITE"
python3 -c "import sys, os; print('dont_write_bytecode', sys.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix, 'PYTHONDONTWRITEBYTECODE', os.environ.get('PYTHONDONTWRITEBYTECODE'))"
for d in torch torch/_inductor torch/_dynamo triton; do
  echo "$d: $(ls "$SITE/$d"/*.py 2>/dev/null | wc -l) .py, $(ls "$SITE/$d/__pycache__" 2>/dev/null | wc -l) in __pycache__"
done
if touch "$SITE/torch/_inductor/.kernelagent-w" 2>/dev/null; then echo "writable"; rm -f "$SITE/torch/_inductor/.kernelagent-w"; else echo "not writable"; fi
findmnt -T "$SITE" -o TARGET,FSTYPE,OPTIONS | tail -1
imports() {
  for i in 1 2; do
    python3 -c "
import time; t=time.perf_counter(); import torch; a=time.perf_counter(); import torch._dynamo, triton; b=time.perf_counter()
import torch._inductor.compile_fx; c=time.perf_counter()
print(f'$1 run $i: torch {a-t:.2f} s, dynamo+triton {b-a:.2f} s, inductor {c-b:.2f} s')"
  done
}
imports before
if [ "${COMPILE:-0}" = 1 ]; then
  s=$(date +%s.%N)
  timeout 300 python3 -m compileall -q -j 0 "$SITE/torch" "$SITE/triton" "$SITE/sympy" "$SITE/networkx" "$SITE/jinja2" > /dev/null 2>&1
  echo "compileall rc $? in $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s"
  for d in torch torch/_inductor; do echo "$d: $(ls "$SITE/$d/__pycache__" 2>/dev/null | wc -l) in __pycache__"; done
  imports after
fi
