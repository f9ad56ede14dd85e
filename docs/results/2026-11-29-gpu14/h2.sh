#!/usr/bin/env bash
# Device run 3 (right after h1.sh, the machine warm), issue 32: served, the build with
# `_sequence_attention` (new) against the tree before it (base: d5233fe's src, from
# base-src.tar), one server start each, in the order new, base, new: the warm ~8,000-token
# shared prompt (1 and 4 clients), then 32 closed-loop clients (500-1,000 in, 64-192 out,
# T 0.7), whose prompts are prefilled in batches. Llama-3.1-8B shapes, bf16, random weights.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
# base-src.tar: `git archive d5233fe src`, carried for the call and not kept
mkdir -p /tmp/base && tar -xf docs/results/2026-11-29-gpu14/base-src.tar -C /tmp/base
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
P="--prefix-len 8000 --input-len 16:48 --output-len 16 --mix greedy --ignore-eos"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t $B "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -2 >> $S
}
serve() {  # serve NAME SRC
  PYTHONPATH=$2 python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/$1.server.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "== $1 ready: $(elapsed)" >> $S
  grep -iE "warm-up done|attention routed" /tmp/$1.server.log | tail -2 | cut -c1-200 >> $S
  load $1-prefix8k 60 --clients 1 --num-requests 30 --warmup 2 $P
  load $1-prefix8k-4 60 --clients 4 --num-requests 60 --warmup 2 $P
  load $1-c32 75 --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 30 --warmup 8
  kill -INT $SERVER; wait $SERVER
}
serve new $PWD/src
serve base /tmp/base/src
serve new2 $PWD/src
cat $S
