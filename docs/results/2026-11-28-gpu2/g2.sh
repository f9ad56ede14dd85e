#!/usr/bin/env bash
# Device run (one H100): issue 35's disk tier (16K prefix) after the read-path fix; issue 36's
# LoRA batch with fused projections; issue 34's speculation (8B target; 1B draft) at 1 and 8 streams.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 -P bench/prompt_cache_disk.py --model /tmp/l8b --prefix-tokens 16000 --rounds 3 --prompt-cache-bytes 8000000000 --dir /tmp --out $OUT/prompt_cache_disk-h100.json > $OUT/disk.log 2>&1; echo "disk rc=$? $(( $(date +%s) - t0 )) s"
tail -c 1200 $OUT/disk.log
timeout 150 python3 -P bench/lora.py --model /tmp/l8b --streams 8 --adapters 4 --tokens 128 --rank 16 --layers 32 --rounds 3 > $OUT/lora-h100.json 2> $OUT/lora.log; echo "lora rc=$? $(( $(date +%s) - t0 )) s"
tail -c 600 $OUT/lora-h100.json; tail -3 $OUT/lora.log
S="python3 -P bench/speculative.py --model /tmp/l8b --kv-cache-bytes 4000000000 --rounds 2 --tokens 128"
timeout 110 $S --streams 1 --variants off "ngram (adaptive, 4)" "ngram fixed 4" --out $OUT/spec-ngram-1.json > $OUT/spec-ngram-1.log 2>&1; echo "spec1 rc=$? $(( $(date +%s) - t0 )) s"; tail -4 $OUT/spec-ngram-1.log
timeout 110 $S --streams 8 --variants off "ngram (adaptive, 4)" "ngram fixed 4" --out $OUT/spec-ngram-8.json > $OUT/spec-ngram-8.log 2>&1; echo "spec8 rc=$? $(( $(date +%s) - t0 )) s"; tail -4 $OUT/spec-ngram-8.log
echo "total: $(( $(date +%s) - t0 )) s"
