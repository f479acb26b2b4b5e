#!/usr/bin/env bash
# Session 30's fourth call on the TPU v5e: recordings that `record` could not make before
# (core_map kernels, now intercepted), of samples added or changed since (random-misuse
# twins, core_handoff_ok, revisit_smem_cursor_ok), and `diff --native` of the PRNG samples
# (compared apart now) and the core_map ones; results in $OUT/results.tgz.part-*.
set -u
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R $OUT/rec
deadline=$(( $(date +%s) + ${BUDGET:-200} ))
jobs=()
for s in revisit_smem_cursor_ok core_map_race_ok core_handoff_ok stochastic_round_bug \
  stateful_random_bug core_map_race_bug core_signal_bug core_swap_bug; do
  jobs+=("record:samples/$s.py"); done
for s in pallas_key_ok stateful_random_ok core_map_race_ok core_handoff_ok; do
  jobs+=("diff:samples/$s.py"); done
bash hardware/device_batch.sh all 40 "$deadline" "${jobs[@]}"
grep -c "^done" $R/all.progress; grep -v "^start\|^done" $R/all.progress
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
