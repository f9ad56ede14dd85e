#!/usr/bin/env bash
# Device run (one H100): issue 34's batch control after the stall fix, 8 streams: ngram and draft model.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1
[ -d /tmp/l1b ] || python3 -m mlx_nursery make-model /tmp/l1b --preset llama-3.2-1b --dtype bfloat16 > $OUT/make1b.log 2>&1
echo "models: $(( $(date +%s) - t0 )) s"
S="python3 -P bench/speculative.py --model /tmp/l8b --kv-cache-bytes 4000000000 --rounds 2 --tokens 128 --streams 8"
timeout 120 $S --variants off "ngram (adaptive, 4)" --out $OUT/spec-ngram-8b.json > $OUT/spec-ngram-8b.log 2>&1; echo "n8 rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/spec-ngram-8b.log
timeout 110 $S --draft-model /tmp/l1b --variants off "draft (adaptive, 4)" --out $OUT/spec-draft-8b.json > $OUT/spec-draft-8b.log 2>&1; echo "d8 rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/spec-draft-8b.log
echo "total: $(( $(date +%s) - t0 )) s"
