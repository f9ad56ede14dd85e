#!/usr/bin/env bash
# Run as one command line right after next2.sh (docs/results/2026-11-30-gpu22/), whose first
# two runs had timed out at 80 s (the first process built the kernels): the engine in-process
# under 32 clients with MLX's compiles, the default (the engine's own), MLX's again.
set -u; source bench/device/prepare.sh >/dev/null 2>&1; S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh; source docs/results/2026-11-30-gpu22/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"; C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32-mlxc 170 $C --mlx-compiles; sa c32-def 100 $C; sa c32-mlxc2 120 $C --mlx-compiles
cd /tmp/j && tar -czf $OUT/json.tgz *.json; cat $S
