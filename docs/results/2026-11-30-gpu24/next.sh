#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a FRESH machine (part 1 staged;
# .whl/part-2 and .whl/test carried): issue 32's cold start (item 4: ready within 40 s of
# launch on a warm disk, no request after ready waiting over 1 s for kernels). The server at its defaults
# (1,024-token chunks on a GPU since c10c808) started where MLX never built a kernel, timed
# from launch to /health; then 32 clients at once with no warm-up requests of the benchmark's
# own (TTFT p99 and the log show any kernel built on first use); then the server restarted on
# the disk its first start filled, timed again, and two greedy clients with no warm-up; then
# the CUDA tests of the sequence attention computed in slices, of the ragged decode attention,
# and of the fused add and RMSNorm (`engine/_fused_norm.py`, never yet run on a GPU).
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
model_8b >> $S
start_server cold.log --max-concurrency 32
U="--url http://127.0.0.1:8100 --model /tmp/l8b --input-len 500:1000 --ignore-eos --warmup 0"
served cold-c32 120 $U --clients 32 --output-len 64:192 --mix temperature --temperature 0.7 \
  --duration 30
stop_server
start_server warm.log --max-concurrency 32
served warm-two 60 $U --clients 2 --output-len 64 --mix greedy --duration 15
stop_server
cuda_tests tests/engine/test_sequence_attention.py tests/engine/test_ragged_cache.py \
  tests/engine/test_fused_norm.py -k "slices or mlxs or kernel_equals or kernel_gives"
grep -ciE "nvrtc|compil" $OUT/cold.log $OUT/warm.log >> $S
pack json.tgz cold-c32 warm-two
cat $S
