#!/usr/bin/env bash
# The test suite: sets up the environment and builds flashattn (scripts/env.sh),
# then runs pytest on tests/. Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -m gpu -k causal
# Exits with pytest's status; "no tests collected" (5) is a failure too.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?

"$PY" -m pytest tests -q -ra "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests (exit 5); counted as a failure" >&2
fi
exit "$rc"
