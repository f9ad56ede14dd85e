#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried), issue 32: the masked
# softmax kernel (`engine/_masked_softmax.py`, a warp a row: h3.sh's ran a block a row) in
# the sequence attention: attention alone
# against MLX's composed fallback (bench/sequence_attention.py: outputs equal, device time),
# then served, the new build against the tree before this session (base: d5233fe's src):
# the warm ~8,000-token shared prompt (1 and 4 clients), 8 clients with ~6,000-token
# prompts (TTFT p50 <= 2 s), one greedy client (>= 150 tok/s). Llama-3.1-8B shapes, bf16, random weights.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
echo "installed: $(elapsed)" >> $S
timeout 150 python3 -P bench/sequence_attention.py --kernels --out $OUT/seq-attn.json > /tmp/seq.log 2>&1
echo "seq-attn: rc=$? $(elapsed)" >> $S; grep -v Warn /tmp/seq.log | cut -c1-330 >> $S
grep -q '"ours_x"' /tmp/seq.log || { tail -40 /tmp/seq.log >> $S; cat $S; exit 1; }  # the kernel failed
model_8b >> $S
# base-src.tar: `git archive d5233fe src`, carried for the call and not kept
mkdir -p /tmp/base && tar -xf docs/results/2026-11-29-gpu14/base-src.tar -C /tmp/base
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
P="--prefix-len 8000 --input-len 16:48 --output-len 16 --mix greedy --ignore-eos"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t $B "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -1 >> $S
}
serve() {  # serve NAME SRC
  PYTHONPATH=$2 python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/$1.server.log 2>&1 &
  SERVER=$!
  for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "== $1 ready: $(elapsed)" >> $S
  load $1-prefix8k 50 --clients 1 --num-requests 30 --warmup 2 $P
  load $1-prefix8k-4 40 --clients 4 --num-requests 40 --warmup 2 $P
  load $1-long6k 70 --clients 8 --input-len 5800:6400 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos --duration 40 --warmup 0
  load $1-one 45 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 25 --warmup 2
  kill -INT $SERVER; wait $SERVER
}
serve new $PWD/src
serve base /tmp/base/src
cat $S
