#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): how far ahead of the
# device the engine thread should run (bench/run_ahead.py): 32 rows of 500-1,000 tokens
# decoding, a 512-token prefill chunk every third step, 5 ms of Python a step beside the
# model; each step's tokens read 1, 2 or 3 steps after its launch, MLX's command buffers
# of 100 kernels (its default on an H100/H200) or 300; two rounds, a process a variant.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
# a first process builds MLX's kernels for the shapes (its numbers are not read)
timeout 200 python3 -P bench/run_ahead.py --model /tmp/l8b --depth 1 --steps 24 > $OUT/build.log 2>&1
echo "== build: rc=$? $(elapsed)" >> $S
timeout 420 python3 -P bench/run_ahead.py --model /tmp/l8b --depth 1 2 3 --ops default 300 \
  --host-ms 5 --rounds 2 --out $OUT/run-ahead.json >> $S 2>&1
echo "== run-ahead: rc=$? $(elapsed)" >> $S
cat $S
