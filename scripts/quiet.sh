#!/bin/sh
# scripts/quiet.sh LOG COMMAND [ARG...]: run COMMAND with its output appended to LOG instead of the
# terminal (make's installs: pip's notices are not news to someone who asked for a demo). When COMMAND
# fails, its output is shown after all, with where the whole log is, and its status is returned.
log=$1
shift
out=$(mktemp)
"$@" >"$out" 2>&1
status=$?
cat "$out" >>"$log"
if [ "$status" -ne 0 ]; then
    cat "$out" >&2
    echo "failed (exit $status): $* (the whole log: $log)" >&2
fi
rm -f "$out"
exit "$status"
