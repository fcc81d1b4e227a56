#!/usr/bin/env bash
# The benchmark: sets up the environment and builds flashattn (scripts/env.sh),
# then runs the speed sweep, `python -m benchmarks sweep`, with the given
# arguments. On a GPU: the full comparison against SDPA's backends; on a
# CPU-only machine: a small CPU run that says what it could not do. `--help`
# lists the options.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?

exec "$PY" -m benchmarks sweep "$@"
