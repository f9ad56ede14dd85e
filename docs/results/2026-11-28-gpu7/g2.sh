#!/usr/bin/env bash
# Device run (after g1.sh, same machine), issue 32: 0.5 ms lost to Python's 5 ms in g1, so
# the other way: a long interval (50 ms), under which the engine thread builds each step
# without being made to hand the GIL over midway (it gives it up in each MLX launch anyway);
# Python's interval again between, then one greedy client both ways.
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
served c32-50 $LOAD32 "$T07" --gil-switch-interval-ms 50; echo "$(( $(date +%s) - t0 )) s"
served c32-pyb $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
served c32-50b $LOAD32 "$T07" --gil-switch-interval-ms 50; echo "$(( $(date +%s) - t0 )) s"
served one-py 1 25 500:1000 128 "--mix greedy:1"; echo "$(( $(date +%s) - t0 )) s"
served one-50 1 25 500:1000 128 "--mix greedy:1" --gil-switch-interval-ms 50; echo "$(( $(date +%s) - t0 )) s"
