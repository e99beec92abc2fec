#!/usr/bin/env bash
# Issue 59: the bytecode helper's lock (server/bytecode.py) on a machine whose torch has no
# bytecode yet. Two helpers started at once, as the servers of a multi-GPU bench start: one
# compiles, the other says another server's helper is compiling; a third check after both ended
# finds the bytecode present.
#   bash scripts/device/bytecode_lock_probe.sh
set -u
. "$(dirname "$0")/env.sh"
timeout 300 python3 -c "
from kernelagent.harness.server import bytecode
a, why_a = bytecode.compile_in_background()
b, why_b = bytecode.compile_in_background()
print('first:', why_a, '->', a.wait(280) if a else '-')
print('second:', why_b, '->', b.wait(280) if b else '-')
print('after both:', bytecode.needed(bytecode.roots()))
" 2>&1 | grep -v "^kernelagent harness"
