#!/usr/bin/env bash
# Device runs 3 and 4 of the second machine, as they ran (each one command line; kept here
# as scripts). r4's 32-client run with graphs off had timed out building the kernels under
# the profiler: run 3 ran it again (now built), with the host's CUDA calls a decode step.
# Run 4: the same load with MLX's buffer cache bounded to 30% of the device instead of the
# engine's 10% (BUFFER_CACHE_FRACTION, changed on the machine's copy only): first under the
# profiler (the calls a step), then without it, then at 10% again, 20 s each.
set -u; source bench/device/prepare.sh; S=$OUT/a-summary.txt; source docs/results/2026-11-29-gpu19/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --clients 32 --output-len 64:192"
if [ "${1:-}" = 3 ]; then
  sa c32-k-off 120 $A --kernels --duration 12
  exit
fi
F=src/mlx_nursery/engine/_memory.py
sed -i 's/^BUFFER_CACHE_FRACTION = 0.1$/BUFFER_CACHE_FRACTION = 0.3/' $F
sa c32-k-cache30 80 $A --duration 12 --kernels
sa c32-cache30 70 $A --duration 20
sed -i 's/^BUFFER_CACHE_FRACTION = 0.3$/BUFFER_CACHE_FRACTION = 0.1/' $F
sa c32-cache10 70 $A --duration 20
