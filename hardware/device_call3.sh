#!/usr/bin/env bash
# Session 30's second call on the TPU v5e: `diff --native` of the _ok samples that call 2 did
# not reach (its deadline), skipping those that hang or abort a v5e (two TensorCores asked of a
# one-core chip; the libtpu compiler abort of cross_call_dma_ok); results in $OUT/results.tgz.part-*.
set -u
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r $OUT/rec
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
SKIP=" core_signal_ok.py core_swap_ok.py cross_call_dma_ok.py mxu_explicit_ok.py add_ok.py aliased_clobber_ok.py bitcast_view_race_ok.py compile_alignment_ok.py compile_block_shape_ok.py compile_params_ok.py compile_primitive_ok.py compile_vmem_ok.py core_map_race_ok.py "
jobs=()
for f in samples/*_ok.py; do
  s=$(basename $f)
  case "$SKIP" in *" $s "*) continue;; esac
  grep -q -- "--devices\|--cores 2\|--tpu v6e\|--tpu v7x" $f && continue
  jobs+=("diff:$f")
done
echo "${#jobs[@]} jobs"
bash hardware/device_batch.sh all 45 "$deadline" "${jobs[@]}"
grep -c "^done" $OUT/r/all.progress; grep -v "^start\|^done" $OUT/r/all.progress
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
