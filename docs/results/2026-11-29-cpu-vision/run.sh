#!/usr/bin/env bash
set -u
cd /work/main
S=/tmp/cpuvis/summary.txt; : > $S
W="--model /tmp/tiny-vlm --images 1 --image-size 224x224 --input-len 32 --output-len 48:96 --mix temperature --temperature 0.7 --ignore-eos --duration 25 --warmup 4"
B=".venv/bin/python -P bench/serving.py --url http://127.0.0.1:8123"
run() {
  local name=$1 src=$2
  PYTHONPATH=$src .venv/bin/python -m mlx_nursery serve --model /tmp/tiny-vlm --port 8123 --max-concurrency 16 > /tmp/cpuvis/$name.server.log 2>&1 &
  for i in $(seq 1 600); do .venv/bin/python -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8123/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  for load in text mixed; do
    if [ $load = text ]; then a="--clients 6 --image-clients 0"; else a="--clients 8 --image-clients 2"; fi
    timeout 120 $B $W $a --out /tmp/cpuvis/$name-$load.json > /tmp/cpuvis/$name-$load.log 2>&1
    grep -E '^\| http' /tmp/cpuvis/$name-$load.log | head -3 | sed "s/^/$name $load /" >> $S
  done
  pkill -INT -f "mlx_nursery serve --model /tmp/tiny-vlm"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve --model /tmp/tiny-vlm" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve --model /tmp/tiny-vlm"
}
run r1-new /work/main/src
run r1-old /tmp/src-old
run r2-old /tmp/src-old
run r2-new /work/main/src
echo done >> $S
