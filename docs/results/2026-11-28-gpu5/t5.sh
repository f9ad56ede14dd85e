#!/usr/bin/env bash
# Device run (two H200s), issue 33: the served group's lone stream against the bare sharded
# step on the same machine, with the records on a ring group beside NCCL (this build) and on
# the step's NCCL stream (31e851f, carried in bench/results/old/src). Llama-3.2-1B shapes,
# so that the fresh machine's kernels build in the device time left; no warm-up (the bench's
# warm-up requests build them).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
PYTHONPATH=$PWD/src python3 -m mlx_nursery make-model /tmp/l1b --preset llama-3.2-1b --dtype bfloat16 > $OUT/make.log 2>&1; echo "model: $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD/src timeout 80 $LAUNCH -n 2 --backend nccl -- python3 -P bench/sharded_step.py --model /tmp/l1b --batches 1 8 --steps 48 --out $OUT/bare-1b.json > $OUT/bare-1b.log 2>&1; echo "bare: rc=$? $(( $(date +%s) - t0 )) s"
serve() {  # $1 name, $2 source dir
  PYTHONPATH=$2 $LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l1b --distributed tensor --port 8100 --max-concurrency 8 --skip-warmup --distributed-timeout 120 > $OUT/$1.log 2>&1 &
  s=$(date +%s); for i in $(seq 1 400); do health 8100 && break; sleep 0.25; done; echo "$1 ready after $(( $(date +%s) - s )) s"
  PYTHONPATH=$PWD/src timeout 75 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l1b --clients 1 --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 12 --warmup 3 --out $OUT/$1-1.json > $OUT/$1-1.log 2>&1; grep -E "^\| http" $OUT/$1-1.log | head -1
  pkill -TERM -f "mlx_nursery serve"; for i in $(seq 1 30); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done
  grep -E "records travel|mlx-nursery follower|Error" $OUT/$1.log | head -4
  pkill -9 -f "mlx_nursery serve|mlx.launch|distributed_utils"; sleep 1
  echo "$1 done: $(( $(date +%s) - t0 )) s"
}
serve new $PWD/src
serve old $PWD/bench/results/old/src
python3 -c "
import json; d=json.load(open('$OUT/bare-1b.json'))['decode']; print('bare', {b: (round(r['host_ms'],2), round(r['wall_ms'],2)) for b,r in d.items()})"
echo "total: $(( $(date +%s) - t0 )) s"
