#!/usr/bin/env bash
# Device run (two H100s): the served tensor-parallel group after the two-frame fix (eca53f8):
# a lone stream, 32 clients, then one client's drop and every rank's tokens for it.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
$LAUNCH -n 2 --backend nccl -- python3 -m mlx_nursery serve --model /tmp/l8b --distributed tensor --port 8100 --max-concurrency 32 --warmup-budget 20 --distributed-timeout 60 > $OUT/ours-tp.log 2>&1 &
s=$(date +%s); for i in $(seq 1 600); do health 8100 && break; sleep 0.25; done; echo "ready after $(( $(date +%s) - s )) s"
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
timeout 60 $B --clients 1 --input-len 128 --output-len 128 --mix greedy:1 --ignore-eos --duration 15 --warmup 2 --out $OUT/tp2-1.json > $OUT/tp2-1.log 2>&1; grep -E "^\| http" $OUT/tp2-1.log | head -1
echo "one: $(( $(date +%s) - t0 )) s"
timeout 110 $B --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 40 --warmup 8 --out $OUT/tp2-32.json > $OUT/tp2-32.log 2>&1; grep -E "^\| http" $OUT/tp2-32.log | head -1
echo "32: $(( $(date +%s) - t0 )) s"
python3 - <<'PY' > $OUT/drop.txt 2>&1
import httpx, json, time
body = {"model": "/tmp/l8b", "messages": [{"role": "user", "content": "hello " * 200}], "max_tokens": 3000, "stream": True, "logit_bias": {}}
got = 0
with httpx.Client(timeout=60) as c:
    with c.stream("POST", "http://127.0.0.1:8100/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                got += 1
                if got >= 20:
                    break
    print("client read", got, "chunks, then closed")
    time.sleep(3)
    m = c.get("http://127.0.0.1:8100/metrics").text
    print("\n".join(l for l in m.splitlines() if ("token" in l or "cancel" in l or "disconnect" in l) and not l.startswith("#"))[:3000])
PY
cat $OUT/drop.txt | head -30
pkill -TERM -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done
grep -E "mlx-nursery follower|statistics|removed" $OUT/ours-tp.log | tail -5
pkill -9 -f "mlx_nursery serve|mlx.launch|distributed_utils"
echo "total: $(( $(date +%s) - t0 )) s"
