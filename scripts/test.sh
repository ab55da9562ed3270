#!/usr/bin/env bash
# The suite as `make test` runs it: three pytest processes side by side - tests/real_engines/ with a
# few other parts (SIDE below) in one, the routing and admission tests and the engine simulators' own
# (ROUTING) in another, everything else in the third. Each test waits most of its time on other
# processes (vLLM and SGLang, whose startup alone is ~50 s; simulators; gateways): one pytest process
# after another the machine's two cores were busy only ~1.2 of the time, so the slowest of the runs
# sets the wall time, and the parts are chosen to make the three about as long (docs/operations.md).
# `.venv/bin/pytest` alone still runs everything in one process.
#
# Extra arguments go to every run (e.g. `scripts/test.sh -x`). The other runs' output is kept in
# .pytest-real-engines.log and .pytest-routing.log and printed after the main run's; the exit status is
# non-zero when any run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${VENV:-.venv}/bin/pytest"
# The suite starts hundreds of Python processes (gateways, simulators, the pytest runs) that import this
# project's modules: with PYTHONDONTWRITEBYTECODE set each one would compile them from source again,
# and pytest rewrite every test module's asserts again (a simulator's start 0.35 s instead of 0.23).
# Their bytecode goes to the git-ignored __pycache__/ directories instead.
unset PYTHONDONTWRITEBYTECODE

# The parts are balanced by their summed test durations (the real engines' part is the longest).
# - tests/engines comes last in its run: its timing tests (a simulator keeping its step period) must
#   not run beside the real engines' start (vLLM and SGLang importing PyTorch hold both cores ~50 s).
# - tests/bench stays out of the run with tests/gateway/admission: together they starve
#   test_limits_share.py's redis client past its 1 s timeouts.
SIDE=(tests/real_engines tests/deploy tests/bench tests/clients tests/gateway/observability)
ROUTING=(tests/gateway/routing tests/gateway/admission tests/engines)
LOG=.pytest-real-engines.log
LOG_ROUTING=.pytest-routing.log
IGNORE=()
for part in "${SIDE[@]}" "${ROUTING[@]}"; do IGNORE+=("--ignore=$part"); done

"$PYTEST" "${SIDE[@]}" -p no:cacheprovider "$@" >"$LOG" 2>&1 &
side=$!
"$PYTEST" "${ROUTING[@]}" -p no:cacheprovider "$@" >"$LOG_ROUTING" 2>&1 &
routing=$!
trap 'kill "$side" "$routing" 2>/dev/null; wait "$side" "$routing" 2>/dev/null' INT TERM

"$PYTEST" "${IGNORE[@]}" "$@"
rest=$?

wait "$routing"
routing_rc=$?
wait "$side"
side_rc=$?
trap - INT TERM
echo
echo "======================= ${ROUTING[*]} ======================="
cat "$LOG_ROUTING"
echo
echo "======================= ${SIDE[*]} ======================="
cat "$LOG"
if [ "$rest" -ne 0 ] || [ "$routing_rc" -ne 0 ] || [ "$side_rc" -ne 0 ]; then
    echo "make test: failed (the main run: exit $rest; ${ROUTING[*]}: exit $routing_rc;" \
        "${SIDE[*]}: exit $side_rc)" >&2
    exit 1
fi
