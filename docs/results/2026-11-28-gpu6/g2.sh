#!/usr/bin/env bash
# Device run (one GPU, after g1.sh), issue 32: what serving over HTTP costs a lone stream
# where the step is all host work (SmolLM2-135M: a few ms of launches a token). One greedy
# streaming client: our server, ours with prompt lookup on (random prompts: the chat case,
# near zero acceptance), and mlx_lm.server, one after another; g1.sh's `off` is the same
# engine in-process.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
SMOL=$(python3 -c "from mlx_nursery.models.default import default_model_dir as d; print(d())")
common="--model $SMOL --clients 1 --duration 30 --warmup 4 --input-len 300:600 --output-len 128 --server-concurrency 8"
timeout 250 python3 -P bench/serving.py --server ours --server mlx_lm $common --out $OUT/one-client.json > $OUT/one-client.log 2>&1; echo "one client: rc=$? $(( $(date +%s) - t0 )) s"; tail -8 $OUT/one-client.log
timeout 150 python3 -P bench/serving.py --server ours --ours-args "--speculative ngram" $common --out $OUT/one-client-ngram.json > $OUT/one-client-ngram.log 2>&1; echo "one client ngram: rc=$? $(( $(date +%s) - t0 )) s"; tail -5 $OUT/one-client-ngram.log
