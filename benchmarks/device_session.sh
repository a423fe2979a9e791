#!/usr/bin/env bash
# One lent-GPU session, prepared to fit one device command (about 9 minutes on an H100/H200):
#   1. the device check (benchmarks/device_check.py: CUDA tests, per-layer table, paper-preset
#      step times, a 2-process torchrun smoke), at most CHECK_S seconds;
#   2. the CIFAR-10 paper presets (experiments/configs/cifar10_paper/) of UNITS trained side by
#      side on the one GPU, each to a wall-clock budget of MINUTES (train.max_minutes: the
#      schedules compressed to end on time), bf16, data resident on the GPU, with TS;
#      no CIFAR-10-C (imagecorruptions is not installed there; regenerating 95 sets is CPU work).
# Writes into OUT (at most 8 files come back): nvidia-smi.txt, check/device_check.{json,log},
# paper_runs.json (benchmarks/paper_runs.py), paper_runs.log.
#
#   bash benchmarks/device_session.sh OUT [MINUTES] [CHECK_S]
# CHECK_ARGS adds arguments of device_check.py (a CPU rehearsal: CHECK_ARGS=--smoke).
# EXTRA_SET adds --set overrides (a CPU rehearsal: EXTRA_SET="model.depth=1 data.limit_train=500").
# On the device machine, pyro-ppl is carried as wheels in .whl/ and CIFAR-10 in .devdata/.
set -u
OUT=${1:?usage: device_session.sh OUT [MINUTES] [CHECK_S]}
MINUTES=${2:-3.2}
CHECK_S=${3:-240}
UNITS=${UNITS:-"softmax kep_svgp mc_dropout sgpa cgpt h_gumbel"}
DATA=${DATA:-.devdata/cifar10_jpeg}
mkdir -p "$OUT/check" /tmp/runs
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, gpytorch, pyro, gpattn_ppl; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', \
'gpytorch', gpytorch.__version__, 'pyro', pyro.__version__)" || exit 4
# decode the CIFAR-10 JPEGs on the host (cached) while the GPU check runs
python3 -c "from gpattn_ppl.data.cifar import read_cifar10; read_cifar10('$DATA', cache_dir='/tmp/cache')" \
  > /tmp/decode.log 2>&1 &
DECODE=$!
date +"check start %T"
timeout -k 10 "$CHECK_S" python3 benchmarks/device_check.py "$OUT/check" --budget-s $((CHECK_S - 25)) \
  ${CHECK_ARGS:-} 2>&1 \
  | tail -n 70
wait $DECODE || { echo "decode failed:"; tail -5 /tmp/decode.log; }
date +"runs start %T"
GRACE=$(python3 -c "print(int($MINUTES * 60 + 100))")
for u in $UNITS; do
  OMP_NUM_THREADS=2 timeout -k 10 "$GRACE" python3 -m gpattn_ppl.run.cli train \
    "experiments/configs/cifar10_paper/$u.yaml" --out "/tmp/runs/$u" --set \
    train.max_minutes="$MINUTES" data.root="$DATA" data.cache_dir=/tmp/cache \
    data.corruptions=null train.progress=false train.val_mc_samples=2 ${EXTRA_SET:-} \
    > "/tmp/runs/$u.log" 2>&1 &
done
wait
date +"runs end %T"
python3 benchmarks/paper_runs.py /tmp/runs "$OUT/paper_runs.json"
for u in $UNITS; do echo "== $u"; tail -n 4 "/tmp/runs/$u.log"; done > "$OUT/paper_runs.log" 2>&1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/nvidia-smi.txt" 2>&1
