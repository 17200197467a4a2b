#!/usr/bin/env bash
# The main job. For now: build the built-in models' iteration graphs and print
# their summaries. It grows into coordinator + local workers training a small
# model as the planner, coordinator and worker land.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TANDEM_BUILD_DIR:-$ROOT/build}"

"$ROOT/scripts/setup.sh"

GRAPH="$BUILD_DIR/common/tandem-graph"
for model in tiny-llama "preset=llama3-70b world=32 micro_batch=1 seq_len=2048 checkpointing=true" \
             "preset=mixtral-8x7b world=32 micro_batch=1 seq_len=2048 checkpointing=true"; do
  echo
  "$GRAPH" --model "$model"
done
