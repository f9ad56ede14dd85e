#!/usr/bin/env bash
# Device run (after g1.sh, same machine), issue 32: g1's pair again in the other order, 0.1 ms,
# and one greedy client both ways.
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
served c32-05b $LOAD32 "$T07" --gil-switch-interval-ms 0.5; echo "$(( $(date +%s) - t0 )) s"
served c32-pyb $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
served c32-01 $LOAD32 "$T07" --gil-switch-interval-ms 0.1; echo "$(( $(date +%s) - t0 )) s"
served one-py 1 25 500:1000 128 "--mix greedy:1"; echo "$(( $(date +%s) - t0 )) s"
served one-05 1 25 500:1000 128 "--mix greedy:1" --gil-switch-interval-ms 0.5; echo "$(( $(date +%s) - t0 )) s"
