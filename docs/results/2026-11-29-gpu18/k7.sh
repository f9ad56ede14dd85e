#!/usr/bin/env bash
# Prepared for the next session, not run: what the engine's own CUDA kernels cost each start
# (MLX compiles custom kernels at every first use and keeps none on disk; the k5 warm-up
# took 17 s with MLX's own kernels on disk). bench/custom_kernels.py in two fresh processes
# (the second confirms nothing carried over). Run 2 of a fresh machine (part 2 carried) or
# on any staged machine; no model needed. Sizes the next cold-start lever: a cache of the
# engine's kernels compiled once (mx.fast.precompiled_cuda_kernel).
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
for run in 1 2; do
  timeout 200 python3 -P bench/custom_kernels.py --out $OUT/custom-kernels-$run.json >> $S 2>&1
  echo "== run $run: rc=$? $(elapsed)" >> $S
done
cat $S
