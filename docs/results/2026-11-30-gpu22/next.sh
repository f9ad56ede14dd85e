#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged;
# .whl/part-2 carried). The decode attention's device time at 32 rows is the step's largest
# item after the matrix products (5.5 ms of 11 a bare step, its one-kernel form), and two
# levers on it were never measured on the served step:
#   - MLX's compile of the engine's read-only kernels instead of its own (decisions/0057:
#     the same source ran 1.3-1.4x faster compiled by MLX, which also reads the queries
#     through their strides; the own compile's contiguity copies them, 32 copy kernels a
#     step), against seconds of compile at each start;
#   - the split form at 32 rows (more blocks than the one-kernel form's 256).
# First the bare step (bench/batch_step.py, the first process builds the kernels), each
# variant with its kernels by family; then the engine in-process under 32 clients, 20 s a
# run, the default first and last; then mlx-lm's default loop (graphs on) for the ratio.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
source docs/results/2026-11-30-gpu22/lib.sh
model_8b >> $S
bs own 170 0 --context 500:1000 --kernels --variants ours
bs mlx-compiles 110 0 --context 500:1000 --kernels --variants ours --mlx-compiles
bs split-512 90 0 --context 500:1000 --kernels --variants ours --attention-blocks 512
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32 80 $C
sa c32-mlx-compiles 80 $C --mlx-compiles
sa c32-b512 80 $C --attention-blocks 512
[ $(( $(date +%s) - PREPARE_T0 )) -lt 460 ] && sa c32-again 80 $C
[ $(( $(date +%s) - PREPARE_T0 )) -lt 520 ] && bs mlx-lm-default 70 1 --context 500:1000 --variants mlx_lm
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
