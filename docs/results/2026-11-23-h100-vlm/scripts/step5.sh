# measurement 3: mixed load (24 text + 8 image streams) vs the 24 text streams alone, one server
# (batch 32); then measurement 4: disconnects, ours vs mlx-vlm's server
set -x
t0=$(date +%s)
. .bench-src/dev/env.sh
python3 -c "import mlx_vlm" && [ -f /tmp/qvl/config.json ] || { echo "FRESH MACHINE: no install or model"; exit 9; }
python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 32 --log-level warning --responses-db :memory: > $LOGS/mixed-ours.log 2>&1 &
SP=$!
ready 8102 && {
  timeout 120 $B --url http://127.0.0.1:8102 $W --clients 24 --image-clients 0 --duration 40 --warmup 8 --out $OUT/m3-text24.json
  timeout 120 $B --url http://127.0.0.1:8102 $W --clients 32 --image-clients 8 --duration 40 --warmup 8 --out $OUT/m3-mixed.json
  timeout 120 $B --url http://127.0.0.1:8102 $W --clients 24 --image-clients 0 --duration 40 --warmup 2 --out $OUT/m3-text24-again.json
  timeout 60 python3 -P .bench-src/dev/disconnect.py --url http://127.0.0.1:8102 --kind ours --model /tmp/qvl --out $OUT/m4-disconnect-ours.json
}
kill -INT $SP; sleep 3; kill -9 $SP 2>/dev/null
python3 -m mlx_vlm.server --model /tmp/qvl --port 8103 --max-num-seqs 8 > $LOGS/disc-mlxvlm.log 2>&1 &
VP=$!
ready 8103 && timeout 90 python3 -P .bench-src/dev/disconnect.py --url http://127.0.0.1:8103 --kind mlx_vlm --model /tmp/qvl --log $LOGS/disc-mlxvlm.log --out $OUT/m4-disconnect-mlxvlm.json
kill -INT $VP; sleep 3; kill -9 $VP 2>/dev/null
pack_logs 5
echo "step5 total: $(( $(date +%s) - t0 )) s"
