#!/usr/bin/env bash
# Device run (a fresh machine: part 1 staged in /tmp/stage, part 2 carried). Issue 32, two
# suspects of a lone client's time: (1) MLX's buffer cache flushed each time the engine goes
# idle, so that a client's next request (one client: every request) allocates every buffer
# again; (2) a logit bias's index and value arrays made from Python lists every step.
# Build A: the engine as at 8924d11 (flush on idle, bias arrays every step:
# previous_sampling.py). Build B: this tree (bias arrays kept) with the idle flush removed.
# On each: one greedy client with logit_bias on EOS (as every --ignore-eos load sends) and
# without, 500-1,000 in, 128 out; the ~8,000-token shared prompt, warm. Llama-3.1-8B shapes.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
echo "installed: $(elapsed)" >> $S
model_8b >> $S
HERE=docs/results/2026-11-29-gpu13
rm -rf /tmp/src-a /tmp/src-b && cp -r src /tmp/src-a && cp -r src /tmp/src-b
cp $HERE/previous_sampling.py /tmp/src-a/mlx_nursery/engine/_sampling.py
sed -i 's/            mx.clear_cache()$/            pass/' /tmp/src-b/mlx_nursery/engine/_runner.py
grep -c 'mx.clear_cache()' /tmp/src-a/mlx_nursery/engine/_runner.py /tmp/src-b/mlx_nursery/engine/_runner.py >> $S
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t $B "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -1 >> $S
}
build() {  # build NAME SRC: one server start, the three loads
  local name=$1 src=$2
  PYTHONPATH=$src python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/$name.server.log 2>&1 &
  local server=$!
  for i in $(seq 1 1600); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "$name ready: $(elapsed)" >> $S
  load $name-one-bias 70 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 25 --warmup 2
  load $name-one-plain 70 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --duration 25 --warmup 2
  load $name-prefix8k 80 --clients 1 --num-requests 30 --warmup 2 --prefix-len 8000 --input-len 16:48 --output-len 16 --mix greedy --ignore-eos
  kill -INT $server; wait $server
  cp /tmp/$name.server.log $OUT/
}
build a /tmp/src-a
build b /tmp/src-b
[ $(( $(date +%s) - PREPARE_T0 )) -lt 450 ] && build a2 /tmp/src-a
cat $S
