#!/usr/bin/env bash
# Device run (two GPUs): tensor parallel over two cards, ours against mlx_lm.server, one run.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name --format=csv,noheader
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
waitready() { s=$(date +%s); for i in $(seq 1 500); do health $1 && break; sleep 0.5; done; echo "$2 ready after $(( $(date +%s) - s )) s" | tee -a $OUT/summary.txt; }
load() {
  timeout 150 python3 -P bench/serving.py --url http://127.0.0.1:$1 --model /tmp/l8b --clients 32 \
    --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos \
    --duration 40 --warmup 8 --out $OUT/$2-32.json > $OUT/$2-32.log 2>&1
  grep -E "^\| http" $OUT/$2-32.log | sed "s#http://127.0.0.1:$1#$2 32 clients#" | tee -a $OUT/summary.txt
  timeout 60 python3 -P bench/serving.py --url http://127.0.0.1:$1 --model /tmp/l8b --clients 1 \
    --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 15 --warmup 1 \
    --out $OUT/$2-1.json > $OUT/$2-1.log 2>&1
  grep -E "^\| http" $OUT/$2-1.log | sed "s#http://127.0.0.1:$1#$2 1 client#" | tee -a $OUT/summary.txt
}
stopall() { pkill -TERM -f "mlx_nursery serve|mlx_lm.server"; sleep 5; pkill -9 -f "mlx_nursery serve|mlx_lm.server|distributed_utils.launch|mlx.launch"; sleep 2; }
$LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l8b --distributed tensor --port 8100 --max-concurrency 32 > $OUT/ours-tp.log 2>&1 &
waitready 8100 ours-tp2; load 8100 ours-tp2; curl -s 127.0.0.1:8100/metrics | grep -E "^mlx_nursery:(generation_tokens|prompt_tokens)_total" | head; stopall
echo "ours done: $(( $(date +%s) - t0 )) s"
$LAUNCH -n 2 --backend nccl -- python3 -m mlx_lm.server --model /tmp/l8b --port 8101 --decode-concurrency 32 > $OUT/mlxlm-tp.log 2>&1 &
waitready 8101 mlxlm-tp2; load 8101 mlxlm-tp2; stopall
grep -iE "rank|error|exit" $OUT/ours-tp.log | head -8
cat $OUT/summary.txt; echo "total: $(( $(date +%s) - t0 )) s"
