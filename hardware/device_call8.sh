#!/usr/bin/env bash
# Session 32's last call on the TPU v5e: after the bfloat16 fixes (chip arithmetic rounded
# in the operand's bits, kernels compiled without excess precision), `pallas-check diff
# --native` of the same one-chip _ok samples as device_call6.sh, until a deadline.
set -u
cd "$(dirname "$0")/.."
source hardware/device_install.sh
mkdir -p $OUT/r
deadline=$(( $(date +%s) + ${BUDGET:-300} ))
OKS=$(sed -n 's/^OKS="\(.*\)"$/\1/p' hardware/device_call6.sh)
jobs=()
for s in $OKS; do jobs+=("diff:samples/$s"); done
bash hardware/device_batch.sh all 45 "$deadline" "${jobs[@]}"
grep -c "^done" $OUT/r/all.progress; grep "exit [^0]" $OUT/r/all.log
