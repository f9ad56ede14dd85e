#!/usr/bin/env bash
# Device run 3 (same machine): the same probes in the other order (150 first), then 500.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-29-gpu15/common.sh
model_8b >> $S
anat b32r 150 32 30
anat a32r "" 32 30
anat c32 500 32 30
anat b1r 150 1 20
anat a1r "" 1 20
cat $S
