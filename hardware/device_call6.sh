#!/usr/bin/env bash
# Session 31's call on the TPU v5e: after the suite-speed changes (the script's plain
# programs kept across processes, kernel programs evicted between sessions, the chip's
# outcome keyed by the call's structure), does the simulation still agree with the chip?
# 1. the benchmark's kernel repository (benchmarks/kernel_suite) run natively on the chip,
#    no pallas-check: its kernels and references are right on a TPU (junit in $OUT/r);
# 2. `pallas-check diff --native` of every _ok sample that runs on one v5e, until a deadline
#    (hardware/device_batch.sh); results tarred into $OUT/results.tgz.part-*.
# Not run in session 31 (no TPU lent); run in session 32: hardware/README.md, "Session 32". A
# call: `BUDGET=520 bash hardware/device_call6.sh`, carry .whl-tpu.
set -u
cd "$(dirname "$0")/.."
source hardware/device_install.sh
mkdir -p $OUT/r $OUT/rec
deadline=$(( $(date +%s) + ${BUDGET:-480} ))
( cd benchmarks/kernel_suite && timeout 150 python3 -m pytest -q -p no:cacheprovider \
    --junitxml=$OUT/r/kernel_suite_native.xml tests > $OUT/r/kernel_suite_native.txt 2>&1;
  echo "exit $?" >> $OUT/r/kernel_suite_native.txt )
tail -3 $OUT/r/kernel_suite_native.txt
OKS="add_ok.py aliased_clobber_ok.py bitcast_view_race_ok.py compile_alignment_ok.py compile_block_shape_ok.py compile_params_ok.py compile_primitive_ok.py compile_vmem_ok.py core_map_race_ok.py core_handoff_ok.py deadlock_ok.py debug_check_ok.py dma_bitcast_bits_ok.py dma_not_waited_ok.py dma_read_before_wait_ok.py dma_same_dst_ok.py dynamic_dma_ok.py empty_carry_ok.py group_combine_ok.py index_map_multiple_of_ok.py nested_pipeline_ok.py oob_block_ok.py oob_dma_ok.py oob_load_ok.py oob_store_ok.py output_revisited_ok.py pack_elementwise_ok.py pallas_key_ok.py prefetch_overwrite_ok.py ragged_pipeline_ok.py regular_sem_dma_ok.py regular_sem_v5e_ok.py reshape_view_ok.py revisit_any_ok.py revisit_smem_cursor_ok.py select_ref_ok.py semaphore_leak_ok.py shared_sem_ok.py stale_prefetch_ok.py stateful_random_ok.py stochastic_round_ok.py uninit_acc_ok.py uninit_mask_multiply_ok.py uninit_masked_ok.py uninit_padding_ok.py unused_scratch_ok.py unused_suppression_ok.py unwritten_grid_ok.py unwritten_half_ok.py unwritten_padding_sliced_ok.py unwritten_select_ok.py vmem_capacity_ok.py vmem_gather_ok.py vmem_headroom_ok.py zero_dma_regular_ok.py zero_stride_ok.py donated_schedule_ok.py mxu_explicit_ok.py"
jobs=()
for s in $OKS; do jobs+=("diff:samples/$s"); done
bash hardware/device_batch.sh all 45 "$deadline" "${jobs[@]}"
grep -c "^done" $OUT/r/all.progress; grep -v "^start\|^done" $OUT/r/all.progress
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
