#!/usr/bin/env bash
# The GPU session's entry point where the developers' guide names it: bench/gpu/gpu_session.sh.
exec bash "$(dirname "$0")/gpu/gpu_session.sh" "$@"
