#!/usr/bin/env bash
# Issue 59: the candidate's process on one CUDA connection (KERNELAGENT_CANDIDATE_CONNECTIONS=1)
# against the caller's (CUDA's 8), before it may become the default: our level-1 solutions
# evaluated both ways, interleaved, ROUNDS times, each variant through its own warm harness (its
# own runtime directory; one baseline cache for both, so their speedups share baselines). Every
# run is a line of $OUT/connections.jsonl (eval_line.py --keep); ab_summary.py prints, per problem
# and variant, the candidate's median time, its speedup over Inductor and the job's start stage.
#   bash scripts/device/connections_ab.sh [rounds] [filter]
set -u
. "$(dirname "$0")/env.sh"
ROUNDS=${1:-2}; FILTER=${2:-'[1-6]_*'}
unset KERNELAGENT_DAEMON
export KERNELAGENT_CACHE_DIR=$(mktemp -d /tmp/ka-cache.XXXX)
RUNS=$(mktemp -d /tmp/conn-ab.XXXX)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# One runtime directory per variant (an associative array cannot hold the empty key).
VARIANTS=(default KERNELAGENT_CANDIDATE_CONNECTIONS=1)
declare -A RUNTIME
for variant in "${VARIANTS[@]}"; do
  RUNTIME[$variant]=$(mktemp -d /tmp/ka-run.XXXX); chmod 700 "${RUNTIME[$variant]}"
done
for round in $(seq 1 "$ROUNDS"); do
  for solution in benchmarks/solutions/level1/$FILTER.py; do
    name=$(basename "$solution" .py)
    for variant in "${VARIANTS[@]}"; do
      tag="r$round|$name|$variant"
      setting=; [ "$variant" = default ] || setting=$variant
      s=$(date +%s.%N)
      KERNELAGENT_RUNTIME_DIR=${RUNTIME[$variant]} env $setting timeout 150 \
        kernelagent eval "benchmarks/level1/$name.py" "$solution" --json > "$RUNS/out.json" 2> "$RUNS/err"; rc=$?
      python3 scripts/device/eval_line.py "$RUNS/out.json" "$tag" "$rc" "$s" "$(date +%s.%N)" \
        --keep "$OUT/connections.jsonl" --stderr "$RUNS/err" > /dev/null
    done
  done
done
python3 scripts/device/ab_summary.py "$OUT/connections.jsonl"
for variant in "${!RUNTIME[@]}"; do pkill -f "${RUNTIME[$variant]}" 2>/dev/null; done
