#!/usr/bin/env bash
# Device run 4 (same machine): served (`mlx-nursery serve`, bench/serving.py --url), MLX's own
# limit against OPS (first argument): 32 closed-loop clients (500-1,000 in, 64-192 out,
# temperature 0.7) with the GPU's busy share sampled, then one greedy client.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-29-gpu15/common.sh
model_8b >> $S
serve srv-a ""
serve srv-b ${1:-150}
cat $S
