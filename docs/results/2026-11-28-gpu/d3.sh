#!/usr/bin/env bash
# Device run (two GPUs): the served tensor-parallel group after rank 0 stopped waiting for its
# records (one client, then 32), then the bare sharded step against one GPU.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
$LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l8b --distributed tensor --port 8100 --max-concurrency 32 --warmup-budget 20 --distributed-timeout 60 > $OUT/ours-tp.log 2>&1 &
s=$(date +%s); for i in $(seq 1 400); do health 8100 && break; sleep 0.5; done; echo "ready after $(( $(date +%s) - s )) s"
timeout 60 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 1 --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 15 --warmup 2 --out $OUT/tp2-1.json > $OUT/tp2-1.log 2>&1; grep -E "^\| http" $OUT/tp2-1.log | head -1
echo "one: $(( $(date +%s) - t0 )) s"
timeout 100 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 40 --warmup 8 --out $OUT/tp2-32.json > $OUT/tp2-32.log 2>&1; grep -E "^\| http" $OUT/tp2-32.log | head -1
echo "32: $(( $(date +%s) - t0 )) s"
pkill -TERM -f "mlx_nursery serve"; sleep 4; pkill -9 -f "mlx_nursery serve|mlx.launch|distributed_utils"; sleep 1
$LAUNCH -n 2 --backend nccl -- python3 -P bench/sharded_step.py --model /tmp/l8b --batches 1 8 32 --out $OUT/sharded-tp2.json > $OUT/sharded-tp2.log 2>&1
python3 -c "import json;d=json.load(open('$OUT/sharded-tp2.json'));print('tp2', {b:(round(v['host_ms'],2),round(v['wall_ms'],2)) for b,v in d['decode'].items()}, 'coll', {b:round(v['wall_ms'],2) for b,v in d['collectives'].items()})"
CUDA_VISIBLE_DEVICES=0 python3 -P bench/sharded_step.py --model /tmp/l8b --batches 1 8 32 --out $OUT/sharded-one.json > $OUT/sharded-one.log 2>&1
python3 -c "import json;d=json.load(open('$OUT/sharded-one.json'));print('one', {b:(round(v['host_ms'],2),round(v['wall_ms'],2)) for b,v in d['decode'].items()})"
echo "total: $(( $(date +%s) - t0 )) s"
