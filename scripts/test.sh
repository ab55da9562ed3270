#!/usr/bin/env bash
# The suite as `make test` runs it: three pytest processes side by side - tests/real_engines/ with a
# few other parts (SIDE below) in one, the routing and admission tests and the engine simulators' own
# (ROUTING) in another, everything else in the third. Each test waits most of its time on other
# processes (vLLM and SGLang, whose startup alone is ~50 s; simulators; gateways): one pytest process
# after another the machine's two cores were busy only ~1.2 of the time, so the slowest of the runs
# sets the wall time, and the parts are chosen to make the three about as long (docs/operations.md,
# "The test suite"). `.venv/bin/pytest` alone still runs everything in one process.
#
# Extra arguments go to every run (e.g. `scripts/test.sh -x`). The other runs' output is kept in
# .pytest-real-engines.log and .pytest-routing.log and printed after the main run's; the exit status is
# non-zero when any run fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST="${VENV:-.venv}/bin/pytest"
# The suite starts hundreds of Python processes (gateways, simulators, the pytest runs) that import this
# project's modules: with PYTHONDONTWRITEBYTECODE set (as on these machines) each one compiled them
# from source again, and pytest rewrote every test module's asserts again (a collection took 21 s of
# CPU instead of 14, a simulator's start 0.35 s instead of 0.23). Their bytecode goes to the
# git-ignored __pycache__/ directories instead.
unset PYTHONDONTWRITEBYTECODE

# How the parts were balanced (2026-12-06, each part's summed test durations with three runs side by
# side): the real engines 293 s, tests/engines 99, tests/reliability 73, tests/deploy 58, tests/bench
# 37, tests/clients 16; routing 255, control 78, admission 68; apis 119, upstream 80, observability 42,
# the top-level gateway tests 38, policies 29. With two runs (routing, control and admission in the
# main one) the side run took 573-615 s and the main one 462-577 s.
# - tests/engines comes last in its run: its timing tests (a simulator keeping its step period) ran
#   first in the main run, beside the real engines' start (vLLM and SGLang importing PyTorch hold both
#   cores for ~50 s), where four and then six streams in a row took 0.98-1.44 s against the model's
#   0.75 (in two of five runs).
# - tests/bench stays out of the run with tests/gateway/admission: with both in one run (2026-12-02)
#   test_limits_share.py failed twice (its redis client's 1 s timeouts), never without.
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
