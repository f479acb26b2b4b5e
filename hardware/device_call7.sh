#!/usr/bin/env bash
# Session 32's second call on the TPU v5e: every pallas_call of the benchmark's kernel
# repository (benchmarks/kernel_suite, 85 TPU-gated tests, twenty-odd kernel families)
# recorded on the chip (hardware/probes/kernel_suite_record.py under `pallas-check record`),
# then replayed there under the simulation (`pallas-check replay`, defaults: on_wait, auto
# tier, chip arithmetic), so that the simulation's values are compared with the chip's on
# production-shaped kernels, not only on the samples. Results in $OUT (tar parts).
set -u
cd "$(dirname "$0")/.."
source hardware/device_install.sh
PC="python3 -m pallas_check"
mkdir -p $OUT/r $OUT/rec
( time timeout 240 $PC record hardware/probes/kernel_suite_record.py -o $OUT/rec/kernel_suite.npz \
    --format json > $OUT/r/record.json 2> $OUT/r/record.err; echo "exit $?" >> $OUT/r/record.err ) 2>> $OUT/r/record.err
tail -4 $OUT/r/record.err; ls -la $OUT/rec
( time timeout 280 $PC replay $OUT/rec/kernel_suite.npz --format json > $OUT/r/replay.json \
    2> $OUT/r/replay.err; echo "exit $?" >> $OUT/r/replay.err ) 2>> $OUT/r/replay.err
tail -6 $OUT/r/replay.err
tar czf - -C $OUT r rec | split -b 15m - $OUT/results.tgz.part- && rm -rf $OUT/r $OUT/rec && ls -la $OUT
