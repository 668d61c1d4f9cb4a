#!/usr/bin/env bash
# pytest in two phases: every test but the timing rows over JOBS processes (each in a vhost of its
# own: tests/broker.py; JOBS=1, one process without pytest-xdist), then the timing rows (-m
# timing: how late a job may run) by themselves, so that the other tests' load on two cores does
# not make them late. The timing rows mostly wait, so they too run over JOBS processes: alone
# they left the cores idle for most of their three minutes. Either phase may select nothing
# (exit 5) as long as the other ran tests.
#
# Usage: scripts/pytest-phases.sh JOBS PYTHON [PYTEST_ARG...]
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 JOBS PYTHON [PYTEST_ARG...]" >&2; exit 2; }
jobs=$1 python=$2
shift 2

parallel=()
[ "$jobs" -le 1 ] || parallel=(-n "$jobs" --dist loadfile)
first=0
# The slowest tests of the first phase are named at its end: what to shorten when CI grows.
"$python" -m pytest "${parallel[@]}" -m "not timing" --durations=15 "$@" || first=$?
second=0
"$python" -m pytest "${parallel[@]}" -m timing "$@" || second=$?
# 5: no test selected in that phase.
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then exit 5; fi
[ "$first" -eq 5 ] && first=0
[ "$second" -eq 5 ] && second=0
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
