#!/usr/bin/env bash
# Session 28's second call on the TPU v5e: `pallas-check record` of every sample that runs on
# one chip and of hardware/probes/recordable.py, `run --native` of three samples, then
# `diff --native` of the _ok samples, until a deadline; results gathered into
# $OUT/results.tar.gz (recordings under rec/).
set -u
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/r $OUT/rec
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
OKS="add_ok.py aliased_clobber_ok.py bitcast_view_race_ok.py compile_alignment_ok.py compile_block_shape_ok.py compile_params_ok.py compile_primitive_ok.py compile_vmem_ok.py core_map_race_ok.py core_signal_ok.py core_swap_ok.py deadlock_ok.py debug_check_ok.py dma_bitcast_bits_ok.py dma_not_waited_ok.py dma_read_before_wait_ok.py dma_same_dst_ok.py dynamic_dma_ok.py empty_carry_ok.py group_combine_ok.py index_map_multiple_of_ok.py nested_pipeline_ok.py oob_block_ok.py oob_dma_ok.py oob_load_ok.py oob_store_ok.py output_revisited_ok.py pack_elementwise_ok.py pallas_key_ok.py prefetch_overwrite_ok.py ragged_pipeline_ok.py regular_sem_dma_ok.py regular_sem_v5e_ok.py reshape_view_ok.py revisit_any_ok.py revisit_smem_cursor_ok.py select_ref_ok.py semaphore_leak_ok.py shared_sem_ok.py stale_prefetch_ok.py stateful_random_ok.py stochastic_round_ok.py uninit_acc_ok.py uninit_mask_multiply_ok.py uninit_masked_ok.py uninit_padding_ok.py unused_scratch_ok.py unused_suppression_ok.py unwritten_grid_ok.py unwritten_half_ok.py unwritten_padding_sliced_ok.py unwritten_select_ok.py vmem_capacity_ok.py vmem_gather_ok.py vmem_headroom_ok.py zero_dma_regular_ok.py zero_stride_ok.py cross_call_dma_ok.py donated_schedule_ok.py mxu_explicit_ok.py"
BUGS="aliased_clobber_bug.py bitcast_view_race_bug.py compile_alignment_bug.py compile_block_shape_bug.py compile_params_bug.py compile_primitive_bug.py compile_vmem_bug.py core_map_race_bug.py core_signal_bug.py core_swap_bug.py debug_check_bug.py dma_bitcast_bits_bug.py dma_read_before_wait_bug.py dma_same_dst_bug.py empty_carry_bug.py group_combine_bug.py index_map_multiple_of_bug.py oob_block_bug.py oob_load_bug.py oob_store_bug.py output_revisited_bug.py pack_elementwise_bug.py prefetch_overwrite_bug.py ragged_pipeline_bug.py reshape_view_bug.py revisit_any_bug.py revisit_smem_cursor_bug.py select_ref_bug.py shared_sem_bug.py stale_prefetch_bug.py uninit_acc_bug.py uninit_mask_multiply_bug.py uninit_masked_bug.py uninit_padding_bug.py unused_suppression_bug.py unwritten_grid_bug.py unwritten_half_bug.py unwritten_padding_sliced_bug.py unwritten_select_bug.py vmem_capacity_bug.py vmem_gather_bug.py vmem_headroom_bug.py zero_stride_bug.py semaphore_leak_bug.py dma_not_waited_bug.py zero_dma_regular_bug.py regular_sem_v5e_bug.py oob_dma_bug.py cross_call_dma_bug.py dynamic_dma_bug.py deadlock_bug.py regular_sem_dma_bug.py donated_schedule_bug.py mxu_explicit_bug.py"
jobs=(record:hardware/probes/recordable.py)
for s in $OKS; do jobs+=("record:samples/$s"); done
if [ "${ONLY_OK:-0}" != 1 ]; then  # ONLY_OK=1: the recordings of the _ok samples alone
  jobs+=(native:samples/add_ok.py native:samples/nested_pipeline_ok.py native:samples/stale_prefetch_ok.py)
  for s in $BUGS; do jobs+=("record:samples/$s"); done
  for s in $OKS; do jobs+=("diff:samples/$s"); done
fi
bash hardware/device_batch.sh all 45 "$deadline" "${jobs[@]}"
grep -c "^done" $OUT/r/all.progress; grep -v "^start\|^done" $OUT/r/all.progress
# files come back at most 16 MB each, 8 of them: the tarball split in 15 MB parts (cat them)
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
