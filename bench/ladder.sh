#!/usr/bin/env bash
# The tuning ladder on ResNet-18 (ImageNet-style) at 32x32 synthetic data on CPU, one sweep, each
# rung in a fresh process; summary.md/.csv/.png land in bench/results/ladder/.
#   bash bench/ladder.sh
# 640 samples (512 train): 16 steps per rung at batch 32, 4 at batch 128; no eval, no checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf bench/results/ladder
exec "${PYTHON:-.venv/bin/python}" -m runner -m experiment=ladder model=resnet18 data=synthetic \
  data.num_samples=640 padding.height=32 padding.width=32 epochs=1 eval=false save_checkpoint=false \
  log_every=1000 hydra.sweep.dir=bench/results/ladder
