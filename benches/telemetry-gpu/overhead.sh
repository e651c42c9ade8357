#!/usr/bin/env bash
# Alternating rounds of the same GPU loop: without telemetry, with it (no uprobes), with it and
# uprobes; prints one line per run.
set -u
cd "$(dirname "$0")"
W=./gpushare-telemetry-watch
script=$1; shift
for round in $(seq 1 "${ROUNDS:-4}"); do
  for mode in --detached --no-uprobes uprobes; do
    m=$mode; [[ $mode == uprobes ]] && m=""
    line=$($W $m -- ${PIN:-} python3 "$script" "$@" 2>&1 | grep -E "^(alloc|launch):")
    echo "$round ${mode#--} $line"
  done
done
