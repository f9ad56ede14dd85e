#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): MLX's CUDA graphs on
# against the engine's default (off), in-process (step_anatomy --mode host --launch), now
# that a batch's buffers come in whole steps (decisions/0055) and the engine compiles its
# own kernels (0057): one greedy client, then 32 clients (500-1,000 in, 64-192 out,
# temperature 0.7), each setting in a process of its own, after a first short process that
# builds the kernels. With graphs on the KV is written as mlx-lm writes it (0056).
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
sa build 200 $A --clients 32 --output-len 64:192 --duration 8
sa one-graphs 80 $A --clients 1 --output-len 128 --temperature 0 --duration 15 --cuda-graphs
sa one-default 80 $A --clients 1 --output-len 128 --temperature 0 --duration 15
[ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] && sa c32-graphs 90 $A --clients 32 --output-len 64:192 --duration 20 --cuda-graphs
[ $(( $(date +%s) - PREPARE_T0 )) -lt 490 ] && sa c32-default 90 $A --clients 32 --output-len 64:192 --duration 20
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
