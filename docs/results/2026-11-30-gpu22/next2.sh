#!/usr/bin/env bash
# Prepared for the next session, not run: device run 3, right after next.sh on the same
# machine. The engine in-process under 32 clients (500-1,000 in, 64-192 out, T 0.7), 20 s a
# run, the default first and last, against MLX's compiles of the engine's read-only
# kernels and the decode attention's split form at 32 rows; then mlx-lm's default decode
# loop (graphs on, as MLX defaults) for issue 32's bare-step ratio against next.sh's.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
source docs/results/2026-11-30-gpu22/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32 80 $C
sa c32-mlx-compiles 80 $C --mlx-compiles
sa c32-b512 80 $C --attention-blocks 512
sa c32-again 80 $C
[ $(( $(date +%s) - PREPARE_T0 )) -lt 480 ] && bs mlx-lm-default 70 1 --context 500:1000 --variants mlx_lm
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
