#!/usr/bin/env bash
# The GPU session's entry point where the developers' guide names it: bench/gpu/stage_gpu_data.sh.
exec bash "$(dirname "$0")/gpu/stage_gpu_data.sh" "$@"
