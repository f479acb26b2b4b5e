#!/usr/bin/env bash
# Session 28's first call on the TPU v5e: the probes, then `diff --native` on the _ok
# samples that run on one chip, then the sample known to halt a core, each step bounded.
# Everything is gathered into $OUT/results.tar.gz at the end (8 files come back at most).
set -u
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 1
export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
python3 -c 'import platform, jax; print(platform.libc_ver(), jax.__version__, jax.devices())' 2>&1 | tail -1
(cd hardware/probes && OUT=$R timeout 100 python3 numerics.py > $R/numerics.log 2>&1; echo "numerics rc $?")
(cd hardware/probes && OUT=$R timeout 60 python3 semaphores.py dma_sem.f32_8rows dma_sem.f32_16rows \
   dma_sem.bf16_16rows dma_sem.f32_3rows dma_sem.f32_8rows_x2 dma_sem.f32_5rows_dyn \
   regular.f32_8rows regular.f32_16rows regular.f32_8rows_x2 regular.f32_3rows_dyn > $R/sem.log 2>&1; echo "sem rc $?")
(cd hardware/probes && OUT=$R timeout 45 python3 semaphores.py regular.empty > $R/sem_re.log 2>&1; echo "sem regular.empty rc $?")
(cd hardware/probes && OUT=$R timeout 45 python3 semaphores.py dma_sem.empty > $R/sem_de.log 2>&1; echo "sem dma_sem.empty rc $?")
(cd hardware/probes && OUT=$R timeout 60 python3 bounded.py > $R/bounded.log 2>&1; echo "bounded rc $?")
S=""
for n in add aliased_clobber bitcast_view_race compile_alignment compile_block_shape compile_params \
  compile_primitive compile_vmem cross_call_dma deadlock debug_check dma_bitcast_bits \
  dma_not_waited dma_read_before_wait dma_same_dst dynamic_dma empty_carry group_combine \
  index_map_multiple_of nested_pipeline oob_block oob_dma oob_load oob_store output_revisited \
  prefetch_overwrite ragged_pipeline regular_sem_dma reshape_view revisit_any revisit_smem_cursor \
  select_ref semaphore_leak shared_sem stale_prefetch uninit_acc uninit_mask_multiply \
  uninit_masked uninit_padding unused_scratch unused_suppression unwritten_grid unwritten_half \
  unwritten_padding_sliced unwritten_select vmem_capacity vmem_gather vmem_headroom zero_stride \
  core_map_race core_signal core_swap; do S="$S samples/${n}_ok.py"; done
OUT=$R timeout 220 python3 hardware/device_diff.py diff_ok diff $S > $R/diff.log 2>&1; echo "diff rc $?"
OUT=$R timeout 40 python3 samples/zero_dma_regular_ok.py > $R/zero_dma_regular_native.log 2>&1; echo "zero_dma_regular native rc $?"
tail -3 $R/zero_dma_regular_native.log
tar czf $OUT/results.tar.gz -C $R . && ls -la $OUT
