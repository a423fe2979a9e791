#!/usr/bin/env bash
# CI (`CI=true bash .ci/run`) on a fresh clone of main while two trainings run beside it: the
# check that no test depends on load (issue 45). Writes benchmarks/results/ci_under_load.txt
# (the CI log's timing lines, the outcome, and the 1-minute load average sampled every 60 s).
# Usage, from the repository root: bash benchmarks/ci_under_load.sh   (about 45 min on 2 cores)
set -u
repo=$(pwd)
work="${TMPDIR:-/tmp}/gpattn_ppl_ci_under_load"
rm -rf "$work" && mkdir -p "$work"
git clone -q "$repo" "$work/clone"
# a venv over this environment's packages: CI's editable install goes there, not over this one
python -m venv --system-site-packages "$work/venv"
train() {  # two long trainings (CoLA on MiniLM features), killed when CI ends
  gpattn-ppl train "$repo/experiments/configs/cola/$1.yaml" --out "$work/load_$1" \
    --set data.encoder=minilm train.epochs=500 train.warmup_epochs=0.5 train.lr=2e-3 \
    train.progress=false > "$work/load_$1.log" 2>&1
}
(cd "$work" && train softmax) & A=$!
(cd "$work" && train sgpa) & B=$!
sleep 5
( while true; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 60; done ) \
  > "$work/load.txt" & L=$!
start=$(date +%s)
(cd "$work/clone" && source "$work/venv/bin/activate" && CI=true bash .ci/run) > "$work/ci.log" 2>&1
rc=$?
end=$(date +%s)
alive=0
for p in $A $B; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
kill $L 2>/dev/null
pkill -f "$work/load_" 2>/dev/null
out="$repo/benchmarks/results/ci_under_load.txt"
{
  echo "command: bash benchmarks/ci_under_load.sh (main at $(git -C "$repo" rev-parse --short HEAD))"
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(date -u +%F)"
  echo "CI exit status: $rc in $((end - start)) s; trainings still running at its end: $alive of 2"
  grep -E "^(install|tests|transformers floor|demo --smoke|docs|CI total)|passed|failed" "$work/ci.log"
  echo "1-minute load average, sampled every 60 s (time, 1/5/15-min):"
  cat "$work/load.txt"
} > "$out"
cat "$out"
