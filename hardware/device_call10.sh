#!/usr/bin/env bash
# Session 33's second call on the TPU v5e: pallas-check's model of the chip's exp2/exp
# (pallas_check/jaxbridge/chip_exp.py) against the chip on every float32 bit pattern, and
# the chip's reciprocal densely with candidate refinements (hardware/probes/exp_verify.py);
# then the kernel repository recorded on the chip and replayed there under the simulation
# with the chip's exp (as device_call7.sh did in session 32). Results in $OUT.
set -u
cd "$(dirname "$0")/.."
source hardware/device_install.sh
( time EXHAUSTIVE_SECONDS=${EXHAUSTIVE_SECONDS:-60} timeout 240 python3 hardware/probes/exp_verify.py ) 2>&1 \
  | grep -v -i "warn" | tail -20
PC="python3 -m pallas_check"
mkdir -p $OUT/r $OUT/rec
( time timeout 200 $PC record hardware/probes/kernel_suite_record.py -o $OUT/rec/kernel_suite.npz \
    --format json > $OUT/r/record.json 2> $OUT/r/record.err; echo "exit $?" >> $OUT/r/record.err ) 2>> $OUT/r/record.err
tail -4 $OUT/r/record.err
( time timeout 230 $PC replay $OUT/rec/kernel_suite.npz --format json > $OUT/r/replay.json \
    2> $OUT/r/replay.err; echo "exit $?" >> $OUT/r/replay.err ) 2>> $OUT/r/replay.err
tail -6 $OUT/r/replay.err
tar czf $OUT/reports.tgz -C $OUT r && rm -rf $OUT/r
tar cf - -C $OUT rec | split -b 15m - $OUT/rec.tar.part- && rm -rf $OUT/rec
ls -la $OUT
