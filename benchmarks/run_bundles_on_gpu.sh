#!/usr/bin/env bash
# The execute level and the GPU benchmarks in one call on a GPU machine that has only
# jax (and numpy) installed: runs the run_bundle.py of each bundle carried there with the
# machine's own python3. Made on CPU first with `pallas-conformance bundle` (see
# benchmarks/README.md, "On a GPU: bundles"); writes reports and logs to $OUT.
#
#   OUT=/tmp/out bash benchmarks/run_bundles_on_gpu.sh [BUNDLE_DIR...]
#
# Phase 1: the cases of every bundle, SHARDS processes per bundle at once (kernels are
# compiled on the CPU cores when first run; each process gets a slice of GPU memory).
# Phase 2: the benchmarks, one bundle at a time, alone on the GPU. Phase 3: each
# bundle's shard reports merged into $OUT/<bundle>-execute.json. Budgets stop the runners
# cleanly (they report what ran); timeouts are a backstop.
set -u
OUT=${OUT:-/tmp/bundle-out}
PY=${PYTHON:-python3}
SHARDS=${SHARDS:-4}
CASE_BUDGET=${CASE_BUDGET:-170}   # seconds of cases per process (all run at once)
BENCH_BUDGET=${BENCH_BUDGET:-75}  # seconds of benchmarks per bundle (one after another)
mkdir -p "$OUT"
if [ "$#" -gt 0 ]; then BUNDLES=("$@"); else BUNDLES=(bundles/triton-sm_90a bundles/mosaic_gpu-sm_90a); fi

{ date -u; $PY -c "import sys, jax, numpy; print('python', sys.version.split()[0], 'jax', jax.__version__, 'numpy', numpy.__version__); print(jax.devices())"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

frac=$(awk -v n="$(( SHARDS * ${#BUNDLES[@]} ))" 'BEGIN { printf "%.2f", 0.9 / n }')
for b in "${BUNDLES[@]}"; do
  name=$(basename "$b")
  for k in $(seq 0 $(( SHARDS - 1 ))); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$frac timeout $(( CASE_BUDGET + 40 )) \
      $PY "$b/run_bundle.py" --no-benchmarks --shard "$k/$SHARDS" --budget "$CASE_BUDGET" \
      --report "$OUT/$name-shard$k.json" > "$OUT/$name-shard$k.log" 2>&1 &
  done
done
wait
for b in "${BUNDLES[@]}"; do
  name=$(basename "$b")
  timeout $(( BENCH_BUDGET + 40 )) $PY "$b/run_bundle.py" --benchmarks-only \
    --budget "$BENCH_BUDGET" --report "$OUT/$name-bench.json" > "$OUT/$name-bench.log" 2>&1
  parts=$(ls "$OUT/$name"-shard*.json "$OUT/$name-bench.json" 2>/dev/null)
  $PY "$b/run_bundle.py" --merge $parts \
    --report "$OUT/$name-execute.json" > "$OUT/$name-merge.log" 2>&1
  echo "== $name"; cat "$OUT/$name-merge.log"; grep -h "^execute:" "$OUT/$name"-shard*.log
  grep -h "^FAIL" "$OUT/$name"-shard*.log | head -40
  tail -n 25 "$OUT/$name-bench.log"
done
date -u
