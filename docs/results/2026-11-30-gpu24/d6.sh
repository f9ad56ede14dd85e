#!/usr/bin/env bash
# Device run 6 (one command line, as it ran, right after d5.sh): the 32-client load served by
# ours alone, 512-token chunks then 1,024, a third served pair.
source bench/device/prepare.sh; source docs/results/2026-11-30-gpu24/lib.sh; B="--server ours --model /tmp/l8b --server-concurrency 32 --ignore-eos --input-len 500:1000 --clients 32 --output-len 64:192 --mix temperature --temperature 0.7 --duration 30 --warmup 8"; served s32-512-b 200 $B; fits 160 && served s32-1024-b 200 $B --ours-args="--prefill-step-size 1024"; pack json.tgz s32-512-b s32-1024-b; cat $S
