# Profile the server's threads under a varied-output load and a lockstep one (issue 18).
set -x
t0=$(date +%s)
bash .whl/part-2/install-mlx-cuda.sh >/dev/null 2>&1 || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/part-4/*.whl || exit 4
export PYTHONPATH=$PWD/.bench-src/src PYTHONUNBUFFERED=1
SPY=/tmp/spy/bin/py-spy; ls /tmp/spy/bin
echo "install: $(( $(date +%s) - t0 )) s"
python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 >/dev/null || exit 5
echo "model: $(( $(date +%s) - t0 )) s"
python3 -m mlx_nursery serve --model /tmp/l8b --served-model-name l8b --max-concurrency 32 --port 8101 --log-level warning --responses-db :memory: > /tmp/server.log 2>&1 &
SP=$!
for i in $(seq 600); do curl -sf http://127.0.0.1:8101/health >/dev/null && break; sleep 0.5; done
echo "ready: $(( $(date +%s) - t0 )) s"
B="python3 -P .bench-src/bench/serving.py --url http://127.0.0.1:8101 --served-model l8b --model /tmp/l8b --clients 32 --mix temperature --temperature 0.7 --input-len 200:300 --ignore-eos"
timeout 120 $B --output-len 128 --duration 20 --warmup 16 --out $OUT/warm.json > /dev/null 2>&1
for kind in varied lockstep; do
  [ $kind = varied ] && OL="64:192" || OL="128"
  ( sleep 8; $SPY record -p $SP -d 20 -r 250 -f raw --threads --nonblocking -o $OUT/spy-$kind.txt > /dev/null 2>&1 ) &
  ( sleep 12; nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader -l 1 > $OUT/gpu-$kind.txt & GP=$!; sleep 12; kill $GP ) &
  timeout 120 $B --output-len $OL --duration 35 --warmup 0 --out $OUT/serve-$kind.json 2>&1 | tail -4
  wait
done
kill -INT $SP; sleep 3; kill -9 $SP 2>/dev/null
tail -5 /tmp/server.log
echo "total: $(( $(date +%s) - t0 )) s"
