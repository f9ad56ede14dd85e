# measurement 2: ours vs mlx-vlm's server, same model and workload, 2 interleaved rounds
set -x
t0=$(date +%s)
. .bench-src/dev/env.sh
python3 -c "import mlx_vlm" && [ -f /tmp/qvl/config.json ] || { echo "FRESH MACHINE: no install or model"; exit 9; }
timeout 560 $B --server ours --server mlx_vlm $W --clients 8 --server-concurrency 8 --duration 40 --rounds 2 --warmup 8 --log-dir $LOGS/vs --out $OUT/m2-vs-mlxvlm.json
pack_logs 4
echo "step4 total: $(( $(date +%s) - t0 )) s"
