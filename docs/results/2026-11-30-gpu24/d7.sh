#!/usr/bin/env bash
# Device run 7 (one command line, as it ran, right after d6.sh): the mixed load (100-2,000
# tokens in, 64-512 out, 32 clients) served by ours, 512-token chunks then 1,024.
source bench/device/prepare.sh; source docs/results/2026-11-30-gpu24/lib.sh; B="--server ours --model /tmp/l8b --server-concurrency 32 --ignore-eos --input-len 100:2000 --clients 32 --output-len 64:512 --mix temperature --temperature 0.7 --duration 30 --warmup 8"; served mixed-512 190 $B; fits 150 && served mixed-1024 190 $B --ours-args="--prefill-step-size 1024"; pack json.tgz mixed-512 mixed-1024; cat $S
