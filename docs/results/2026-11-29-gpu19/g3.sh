#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): the decode attention and
# the masked softmax compiled by the engine's own NVRTC call (engine/_own_kernels.py,
# decisions/0057) rather than by MLX behind its device headers. Their first-use cost in two
# fresh processes (g2 measured MLX's compiles: 14-23 s a start), their outputs against MLX's
# (bench/ragged_attention.py's check, the masked softmax's self-check), then a server's
# restart time: one start that builds MLX's own kernels, then a second (MLX's kernels on
# disk, as a restarted server has them), each followed by one greedy client.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
mkdir -p /tmp/g
for run in 1 2; do
  timeout 60 python3 -P bench/custom_kernels.py --out /tmp/g/custom-kernels-$run.json > /tmp/g/ck-$run.log 2>&1
  echo "== custom kernels $run: rc=$? $(elapsed)" >> $S; tail -6 /tmp/g/ck-$run.log >> $S
done
timeout 120 python3 -P bench/ragged_attention.py --out /tmp/g/ragged.json > /tmp/g/ragged.log 2>&1
echo "== ragged attention: rc=$? $(elapsed)" >> $S; grep -iE "ok|max|ms" /tmp/g/ragged.log | head -20 >> $S
model_8b >> $S
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
for start in 1 2; do
  python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 > /tmp/g/start$start.log 2>&1 &
  s=$(date +%s); for i in $(seq 1 1000); do health && break; sleep 0.25; done
  echo "== start $start: ready after $(( $(date +%s) - s )) s ($(elapsed))" >> $S
  grep -iE "warm-up|compiled by|not compiled" /tmp/g/start$start.log | tail -4 >> $S
  timeout 60 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 1 \
    --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 15 --warmup 0 \
    --out /tmp/g/one$start.json > /tmp/g/one$start.log 2>&1
  echo "== one client after start $start: rc=$? $(elapsed)" >> $S; grep -E '^\| http' /tmp/g/one$start.log >> $S
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 80); do pgrep -f "mlx_nursery serve" > /dev/null || break; sleep 0.25; done
  [ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] || break
done
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
