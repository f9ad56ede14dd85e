#!/usr/bin/env bash
# Device run 5 (run as one command line right after d4.sh, on the same machine; kept here as
# it ran): the 32-client load served with 1,024-token prefill chunks against mlx_lm.server
# in one run, then 8 clients of ~6,000-token prompts with them (issue 32: TTFT p50 <= 2 s).
source bench/device/prepare.sh; source docs/results/2026-11-30-gpu24/lib.sh; B="--model /tmp/l8b --server-concurrency 32 --ignore-eos"; served s32-both-chunk1024 300 --server ours --server mlx_lm $B --input-len 500:1000 --clients 32 --output-len 64:192 --mix temperature --temperature 0.7 --duration 30 --warmup 8 --ours-args="--prefill-step-size 1024"; fits 200 && served c8-long-chunk1024 200 --server ours $B --input-len 5500:6500 --clients 8 --output-len 64:128 --mix temperature --temperature 0.7 --duration 40 --warmup 2 --ours-args="--prefill-step-size 1024"; pack json.tgz s32-both-chunk1024 c8-long-chunk1024; cat $S
