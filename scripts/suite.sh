#!/usr/bin/env bash
# The benchmark suite, the README's main job: sets up the environment and builds
# flashattn (scripts/env.sh), then runs `python -m benchmarks suite` with the
# given arguments. It writes a report folder, benchmarks/results/<date>-<gpu-slug>/
# (report.md, CSVs, PNG plots) or --out. On a GPU: speed against SDPA's
# backends, memory, regimes, kernel launches; on a CPU-only machine: a small
# CPU run that says what needs a GPU. `--help` lists the options.
#
# The kernels are compiled only where torch sees a GPU (a CPU run cannot use
# them; `bash scripts/test.sh` compiles them anyway, as CI must), and never for
# `--help` once flashattn is installed. matplotlib (the report's plots) is
# installed into the environment the suite runs in when it is missing.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
case " $* " in
    *" -h "* | *" --help "*) export FLASHATTN_KERNELS_WANTED="${FLASHATTN_KERNELS_WANTED:-no}" ;;
    *) export FLASHATTN_KERNELS_WANTED="${FLASHATTN_KERNELS_WANTED:-if-gpu}"
       export FLASHATTN_EXTRA_PACKAGES="${FLASHATTN_EXTRA_PACKAGES:-matplotlib}" ;;
esac
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?

exec "$PY" -m benchmarks suite "$@"
