#!/usr/bin/env bash
# Prepared for the next session, not run: device run 3, right after next.sh on the same
# machine (the kernels built; .whl/part-2 carried). Issue 32's Poisson target at the current
# defaults (4 requests/s of the 32-client load's requests: completed >= 0.98 of offered, TTFT
# p50 <= 250 ms, p99 <= 1 s), ours then mlx_lm.server in one run; then the mixed load
# (100-2,000 in) served with 2,048-token chunks against the default 1,024 (mlx-lm's chunk is
# 2,048; prompts over 1,024 tokens take two chunks at the default).
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
B="--model /tmp/l8b --server-concurrency 32 --ignore-eos"
served poisson 300 --server ours --server mlx_lm $B --input-len 500:1000 --output-len 64:192 \
  --rate 4 --duration 45 --mix temperature --temperature 0.7 --warmup 8
M="--server ours $B --input-len 100:2000 --clients 32 --output-len 64:512 --mix temperature \
  --temperature 0.7 --duration 30 --warmup 8"
fits 150 && served mixed-1024 150 $M
fits 150 && served mixed-2048 150 $M --ours-args="--prefill-step-size 2048"
pack json.tgz poisson mixed-1024 mixed-2048
cat $S
