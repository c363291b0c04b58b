#!/usr/bin/env bash
# ./run demo: the most complete end-to-end story kdm has today.
# Usage: scripts/demo.sh <build dir>
set -euo pipefail
build=${1:-build}
exec "$build/bin/kdm_node_demo" "${@:2}"
