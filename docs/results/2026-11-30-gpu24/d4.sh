#!/usr/bin/env bash
# Device run 4, right after d3.sh on the same machine: one greedy client through HTTP at the
# default and with MLX's CUDA graphs on (`--cuda-graphs`, which a lone stream gained from
# in-process; issue 32's one-client target is >= 150 tok/s); then, if d2/d3's pairs chose
# prefill chunks of 1,024 tokens (both pairs faster), the 32-client load served with them.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
O="--server ours $B --clients 1 --output-len 128 --mix greedy --duration 20 --warmup 1"
served one-http 100 $O
served one-http-graphs 120 $O --ours-args=--cuda-graphs
wins=$(python3 - <<'PY'
import json
r = lambda n: json.load(open(f"/tmp/j/{n}.json"))["host"]["tok_per_s"]
try:
    print(int(r("c32-chunk1024") > r("c32") and r("c32-chunk1024-again") > r("c32-again")))
except (OSError, KeyError):
    print(0)
PY
)
echo "chunks of 1,024 won both pairs: $wins" >> $S
[ "$wins" = 1 ] && fits 200 && served s32-chunk1024 200 --server ours $B --clients 32 \
  --output-len 64:192 --mix temperature --temperature 0.7 --duration 30 --warmup 8 \
  --ours-args="--prefill-step-size 1024"
pack json.tgz one-http one-http-graphs s32-chunk1024
cat $S
