#!/bin/bash
# Issue #42's study, reduced to what one session's time allows
# (docs/EXPERIMENTS.md): 8 workers, plain SGD lr 0.05 everywhere (the outer
# variants' inner optimizer too), 300,000 samples a run, seeds 1-3.
cd /work/main
S=/work/study-42
e() {
  local name=$1
  shift
  /usr/bin/python3 tools/experiments/experiment.py --bin /tmp/bin_outer \
    --workers 8 --seeds 1,2,3 --eval_every 1s --samples 300000 \
    --worker_flags="--optimizer=sgd --lr=0.05" --out "$S/$name" "$@" \
    >"$S/$name.log" 2>&1
}
e loopback-ar --links loopback --profiles none,slow:4 --modes allreduce --compress f16
e loopback --links loopback --profiles none,slow:4 \
  --modes bsp,async,async+dc,async+easgd,bsp+diloco,async+diloco
e 1gbit-ar --links 1gbit --profiles none --modes allreduce --compress f16
e 1gbit --links 1gbit --profiles none --modes async,async+dc,async+easgd,async+diloco
e 100mbit-ar --links 100mbit --profiles slow:4 --modes allreduce --compress f16
e 100mbit --links 100mbit --profiles slow:4 \
  --modes bsp,async+easgd,bsp+diloco,async+diloco,async+diloco64
echo STUDY DONE >$S/done
