#!/usr/bin/env bash
# Prepared for a later session, not yet run (this session's device time was spent): device
# run 2 of a fresh machine (part 1 staged, part 2 carried), issue 32. Served, the warm
# ~8,000-token shared prompt with one client and with four at once, this tree against the
# tree before the padded chunk's rows were moved as slices (base-src.tar: `git archive
# 289e04f src`, carried for the call and not kept); then the in-process probe of k5.sh on
# this tree. Llama-3.1-8B shapes, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
mkdir -p /tmp/base && tar -xf docs/results/2026-11-29-gpu15/base-src.tar -C /tmp/base
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
P="--prefix-len 8000 --input-len 16:48 --output-len 16 --mix greedy --ignore-eos"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b "$@" \
    --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "  $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -1 >> $S
}
serve() {  # serve NAME SRC
  PYTHONPATH=$2 python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 \
    > /tmp/$1.server.log 2>&1 &
  local server=$!
  for i in $(seq 1 1200); do health && break; sleep 0.25; done
  echo "== $1 ready: $(elapsed)" >> $S
  load $1-prefix1 60 --clients 1 --num-requests 30 --warmup 2 $P
  load $1-prefix4 90 --clients 4 --num-requests 60 --warmup 2 $P
  kill -INT $server; wait $server
}
serve new $PWD/src
serve base /tmp/base/src
cat $S
