set -u
source bench/device/prepare.sh > /dev/null
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --clients 32 --output-len 64:192 --duration 20"
sa c32-b512 75 $A
sa c32-b128 75 $A --attention-blocks 128
sed -i 's/--duration 30 --warmup 8/--duration 30 --warmup 8/' docs/results/2026-11-30-gpu23/c3.sh
bash docs/results/2026-11-30-gpu23/c3.sh > /dev/null 2>&1
cd /tmp/j && tar -czf $OUT/json2.tgz *.json *.log; cat $S
