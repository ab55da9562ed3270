#!/usr/bin/env bash
# The suite as `make test` runs it: tests/real_engines/ in one pytest process, everything else in
# another, side by side. The real-engine tests spend most of their time waiting for vLLM and SGLang
# (their startup alone is ~50 s), the others for simulators and gateways; run one after the other on
# 2 cores they took 10.5 min, side by side the slower of the two sets the time (docs/operations.md,
# "The test suite"). `.venv/bin/pytest` alone still runs everything in one process.
#
# Extra arguments go to both pytest runs (e.g. `scripts/test.sh -x`). The real-engine run's output is
# kept in .pytest-real-engines.log and printed after the other run's; the exit status is non-zero when
# either run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${VENV:-.venv}/bin/pytest"
LOG=.pytest-real-engines.log

"$PYTEST" tests/real_engines -p no:cacheprovider "$@" >"$LOG" 2>&1 &
real=$!
trap 'kill "$real" 2>/dev/null; wait "$real" 2>/dev/null' INT TERM

"$PYTEST" --ignore=tests/real_engines "$@"
rest=$?

wait "$real"
real_rc=$?
trap - INT TERM
echo
echo "================================ tests/real_engines ================================"
cat "$LOG"
if [ "$rest" -ne 0 ] || [ "$real_rc" -ne 0 ]; then
    echo "make test: failed (the rest of the suite: exit $rest; tests/real_engines: exit $real_rc)" >&2
    exit 1
fi
