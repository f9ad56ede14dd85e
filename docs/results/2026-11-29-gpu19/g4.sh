#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): g3's restart again, after
# a first start that built MLX's own kernels for every batch (g3's first start skipped most
# of its warm-up, so its second start still built MLX kernels): start 1, 32 clients for 25 s,
# stop; start 2 (MLX's kernels on disk, the engine's compiled by its own NVRTC), its ready
# time and warm-up, then one greedy client with no warm-up requests.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
mkdir -p /tmp/g
model_8b >> $S
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
for start in 1 2; do
  python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/g/start$start.log 2>&1 &
  s=$(date +%s); for i in $(seq 1 1000); do health && break; sleep 0.25; done
  echo "== start $start: ready after $(( $(date +%s) - s )) s ($(elapsed))" >> $S
  grep -iE "warm-up|compiled by|not compiled" /tmp/g/start$start.log | tail -3 >> $S
  if [ $start = 1 ]; then L="--clients 32 --output-len 64:192 --mix temperature --temperature 0.7 --duration 25"
  else L="--clients 1 --output-len 128 --mix greedy --duration 15"; fi
  timeout 90 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b $L \
    --input-len 500:1000 --ignore-eos --warmup 0 --out /tmp/g/load$start.json > /tmp/g/load$start.log 2>&1
  echo "== load after start $start: rc=$? $(elapsed)" >> $S; grep -E '^\| http' /tmp/g/load$start.log | head -1 >> $S
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 120); do pgrep -f "mlx_nursery serve" > /dev/null || break; sleep 0.25; done
done
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
