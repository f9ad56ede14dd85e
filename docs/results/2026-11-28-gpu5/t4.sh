#!/usr/bin/env bash
# Device run (two H200s), call D, issue 33: the served tensor-parallel group with the records
# on a ring group beside NCCL (this build) against the build before (31e851f, records on the
# step's NCCL stream; its source carried in bench/results/old/src): a lone stream (against
# the bare sharded step of the same run) and 32 clients.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
PYTHONPATH=$PWD/src timeout 100 $LAUNCH -n 2 --backend nccl -- python3 -P bench/sharded_step.py --model /tmp/l8b --batches 1 32 --steps 32 --out $OUT/bare-tp2.json > $OUT/bare-tp2.log 2>&1; echo "bare: rc=$? $(( $(date +%s) - t0 )) s"
serve() {  # $1 name, $2 source dir, $3 clients-32 seconds
  PYTHONPATH=$2 $LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l8b --distributed tensor --port 8100 --max-concurrency 32 --warmup-budget 20 --distributed-timeout 60 > $OUT/$1.log 2>&1 &
  s=$(date +%s); for i in $(seq 1 800); do health 8100 && break; sleep 0.25; done; echo "$1 ready after $(( $(date +%s) - s )) s"
  B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
  PYTHONPATH=$PWD/src timeout 50 $B --clients 1 --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 15 --warmup 2 --out $OUT/$1-1.json > $OUT/$1-1.log 2>&1; grep -E "^\| http" $OUT/$1-1.log | head -1
  PYTHONPATH=$PWD/src timeout $(( $3 + 50 )) $B --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration $3 --warmup 8 --out $OUT/$1-32.json > $OUT/$1-32.log 2>&1; grep -E "^\| http" $OUT/$1-32.log | head -1
  pkill -TERM -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done
  grep -E "records travel|mlx-nursery follower" $OUT/$1.log | head -3
  pkill -9 -f "mlx_nursery serve|mlx.launch|distributed_utils"; sleep 1
  echo "$1 done: $(( $(date +%s) - t0 )) s"
}
serve new $PWD/src 30
serve old $PWD/bench/results/old/src 30
python3 -c "
import json; d=json.load(open('$OUT/bare-tp2.json'))['decode']; print('bare', {b: round(r['wall_ms'],2) for b,r in d.items()})"
echo "total: $(( $(date +%s) - t0 )) s"
