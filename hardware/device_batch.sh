#!/usr/bin/env bash
# Run COMMAND:SCRIPT jobs through hardware/device_batch.py until each has ended: a process
# that dies (a compiler crash) or is ended by its watchdog (a hang) is followed by one for
# the jobs left, the job it was in marked in $OUT/r/NAME.progress. Stops at DEADLINE
# (seconds since the epoch).
# Usage: hardware/device_batch.sh NAME LIMIT DEADLINE JOB...
name=$1 limit=$2 deadline=$3; shift 3
jobs=("$@")
while [ ${#jobs[@]} -gt 0 ] && [ "$(date +%s)" -lt "$deadline" ]; do
  left=$(( deadline - $(date +%s) ))
  timeout -k 5 "$left" python3 hardware/device_batch.py "$name" "$limit" "${jobs[@]}" \
    >> "$OUT/r/$name.log" 2>&1
  echo "$name: process ended with $?" >> "$OUT/r/$name.log"
  ended=$(grep -c "" "$OUT/r/$name.progress" 2>/dev/null || echo 0)
  rest=()
  for job in "${jobs[@]}"; do
    grep -qx "done $job" "$OUT/r/$name.progress" && continue
    if grep -qx "start $job" "$OUT/r/$name.progress"; then
      grep -qx "hung $job" "$OUT/r/$name.progress" || echo "died $job" >> "$OUT/r/$name.progress"
      continue
    fi
    rest+=("$job")
  done
  jobs=("${rest[@]}")
done
