#!/usr/bin/env bash
# Session 30's third call on the TPU v5e: the probes of float32 subnormals and stochastic
# rounding per target (subnormals.py), of a two-TensorCore mesh on the v5e's one core
# (cores.py, a case a process, hangs ended by timeout), then `record` and `diff --native` of the
# samples changed after the second call and `diff --native` of those it skipped.
set -u
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R $OUT/rec
(cd hardware/probes && OUT=$R timeout 120 python3 subnormals.py > $R/subnormals.log 2>&1; echo "subnormals rc $?")
for c in forward order backward; do
  (cd hardware/probes && OUT=$R timeout 40 python3 cores.py $c > $R/cores_$c.log 2>&1; echo "cores $c rc $?")
done
deadline=$(( $(date +%s) + ${BUDGET:-300} ))
jobs=()
for s in stochastic_round_ok debug_check_ok debug_check_bug index_map_multiple_of_ok \
  index_map_multiple_of_bug revisit_smem_cursor_ok; do jobs+=("record:samples/$s.py"); done
for s in stochastic_round_ok debug_check_ok index_map_multiple_of_ok revisit_smem_cursor_ok \
  regular_sem_dma_ok zero_dma_regular_ok; do jobs+=("diff:samples/$s.py"); done
jobs+=(native:samples/add_ok.py native:samples/nested_pipeline_ok.py native:samples/stale_prefetch_ok.py)
bash hardware/device_batch.sh all 45 "$deadline" "${jobs[@]}"
grep -c "^done" $R/all.progress; grep -v "^start\|^done" $R/all.progress
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
