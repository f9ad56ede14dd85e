#!/usr/bin/env bash
# Device run (two H100s), issue 33: a model whose weights do not fit on one 80 GB GPU
# (Llama-3.1-70B shapes, 8-bit, random weights: ~75 GB) served tensor-parallel on two; a lone
# stream, 32 clients, then one client's drop and each rank's tokens for it.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
df -h /tmp | tail -1
[ -d /tmp/l70 ] || timeout 420 python3 -m mlx_nursery make-model /tmp/l70 --preset llama-3.1-70b --dtype bfloat16 --bits 8 > $OUT/make70.log 2>&1
echo "make rc=$? $(( $(date +%s) - t0 )) s; $(du -sh /tmp/l70 | cut -f1)"; tail -2 $OUT/make70.log
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
$LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l70 --distributed tensor --port 8100 --max-concurrency 32 --warmup-budget 20 --distributed-timeout 60 > $OUT/tp70.log 2>&1 &
s=$(date +%s); for i in $(seq 1 1600); do health 8100 && break; sleep 0.25; done; echo "ready after $(( $(date +%s) - s )) s"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l70"
timeout 70 $B --clients 1 --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 12 --warmup 1 --out $OUT/tp70-1.json > $OUT/tp70-1.log 2>&1; grep -E "^\| http" $OUT/tp70-1.log | head -1
echo "one: $(( $(date +%s) - t0 )) s"
timeout 120 $B --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 30 --warmup 8 --out $OUT/tp70-32.json > $OUT/tp70-32.log 2>&1; grep -E "^\| http" $OUT/tp70-32.log | head -1
echo "32: $(( $(date +%s) - t0 )) s"
python3 - <<'PY' > $OUT/drop70.txt 2>&1
import httpx, time
URL = "http://127.0.0.1:8100"
def generated(c):
    for line in c.get(URL + "/metrics").text.splitlines():
        if line.startswith("mlx_nursery:generation_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    return None
body = {"model": "l70", "prompt": "hello " * 300, "max_tokens": 3000, "temperature": 0, "stream": True}
with httpx.Client(timeout=120) as c:
    before = generated(c)
    got = 0
    with c.stream("POST", URL + "/v1/completions", json=body) as r:
        print("status", r.status_code)
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got += 1
                if got >= 20:
                    break
    print("client read", got, "chunks, then closed")
    time.sleep(3)
    after = generated(c)
    print("rank 0 generated for it:", None if before is None or after is None else after - before)
PY
cat $OUT/drop70.txt
# SIGTERM to rank 0 alone (it drains and ends the group): a pattern that also matches
# mlx.launch ends the launcher first, and with it the group's log. (The run of 2026-11-28
# used `pkill -TERM -f "mlx_nursery serve"`, so rank 1's counters were never printed.)
for p in $(pgrep -f "^python3 -m mlx_nursery serve"); do grep -qz "^MLX_RANK=0$" /proc/$p/environ && kill -TERM $p; done
for i in $(seq 1 90); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done
grep -E "mlx-nursery follower" $OUT/tp70.log | tail -2 | cut -c1-600
grep -E "Node with rank" $OUT/tp70.log | tail -2
pkill -9 -f "mlx_nursery serve|mlx.launch|distributed_utils"
echo "total: $(( $(date +%s) - t0 )) s"
