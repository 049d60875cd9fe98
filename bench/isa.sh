#!/usr/bin/env bash
# The runner's CPU ISA cap (ONEDNN_MAX_CPU_ISA=AVX2) on and off, side by side in one sweep, each
# job in a fresh process (oneDNN reads the variable once per process); summary in bench/results/isa/.
#   bash bench/isa.sh
# resnet8 (width 16) on synthetic 3x32x32, batch 32, graph mode, 5 training steps per job.
# A value of ONEDNN_MAX_CPU_ISA in your environment would win over both jobs: it is unset here.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf bench/results/isa
unset ONEDNN_MAX_CPU_ISA
exec "${PYTHON:-.venv/bin/python}" -m runner -m "device.cpu_isa_cap=AVX2,''" model=resnet8 data=synthetic \
  data.num_samples=200 padding.height=32 padding.width=32 batch_size=32 epochs=1 eval=false \
  save_checkpoint=false log_every=1000 hydra.sweep.dir=bench/results/isa
