#!/usr/bin/env bash
# The benchmark suite, the README's main job: sets up the environment and builds
# flashattn (scripts/env.sh), then runs `python -m benchmarks suite` with the
# given arguments. It writes a report folder, benchmarks/results/<date>-<gpu-slug>/
# (report.md, CSVs, PNG plots) or --out. On a GPU: speed against SDPA's
# backends, memory, regimes, kernel launches; on a CPU-only machine: a small
# CPU run that says what needs a GPU. `--help` lists the options.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?

exec "$PY" -m benchmarks suite "$@"
