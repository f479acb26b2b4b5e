#!/bin/bash
# Regenerates docs/screens/{race,uninit}-{80,100,110,120,140}.txt: the report of a race and
# of an uninitialized read as a terminal of that many columns shows it (tmux capture-pane).
# Needs tmux and `pallas-check` on PATH (e.g. the project's virtualenv activated).
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
for W in 80 100 110 120 140; do
  for CASE in race uninit; do
    if [ $CASE = race ]; then CMD="pallas-check run samples/dma_same_dst_bug.py --races"
    else CMD="pallas-check run samples/dma_read_before_wait_bug.py"; fi
    S=pallas-check-screen-$W-$CASE
    tmux new-session -d -s $S -x $W -y 50 "env -i HOME=$HOME TERM=xterm-256color PATH=$PATH PYTHONPATH=$ROOT PS1='$ ' bash --norc --noprofile"
    sleep 0.5
    tmux send-keys -t $S "$CMD" Enter
    for _ in $(seq 1 240); do  # until the summary line and the next prompt are shown
      sleep 0.5
      if tmux capture-pane -p -S - -t $S | grep -q '^pallas-check: .*pallas_call' &&
         [ "$(tmux capture-pane -p -S - -t $S | sed '/^$/d' | tail -1)" = '$' ]; then break; fi
    done
    tmux capture-pane -p -S - -t $S | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' \
      > docs/screens/$CASE-$W.txt
    tmux kill-session -t $S
  done
done
