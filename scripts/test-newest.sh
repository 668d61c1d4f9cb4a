#!/usr/bin/env bash
# The unit suite, then the integration suite on the local broker, with the newest releases of the
# libraries ricochet is built on installed over the lock, in a virtualenv of its own ($NEWEST_VENV,
# default .venv-newest): a release that breaks ricochet fails here before a user installs it. The
# versions installed are printed first, and a failure names the packages newer than the lock.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(aio-pika aiormq pamqp structlog pydantic pydantic-settings tenacity)
venv=${NEWEST_VENV:-.venv-newest}
pip() { "$venv/bin/pip" --quiet --disable-pip-version-check "$@"; }

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
pip install --upgrade pip
# The lock first, then the project and its test tools (nothing to resolve past the lock), then
# the newest release of each package, whatever pyproject.toml's bounds say: a new major shows up
# here first. pip says which of ricochet's bounds it then breaks; the suites say whether ricochet
# itself breaks.
pip install --require-hashes --no-deps -r requirements.lock
pip install -e '.[dev,docs]'
pip install --upgrade "${packages[@]}"

# "name locked installed" for each package; "-" for one the lock does not pin.
versions=$("$venv/bin/python" - "${packages[@]}" <<'PY'
import re
import sys
from importlib.metadata import version
from pathlib import Path

locked = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", Path("requirements.lock").read_text(), re.M))
for name in sys.argv[1:]:
    print(name, locked.get(name, "-"), version(name))
PY
)
echo "newest releases over the lock (package, locked, installed):"
column -t <<<"$versions" | sed 's/^/  /'
newer=$(awk '$2 != $3 { printf "%s%s %s (the lock has %s)", sep, $1, $3, $2; sep = ", " }' <<<"$versions")

# A suite, and on failure the packages that may have broken it. The suites run beside make test
# on two cores, where a test of lateness can miss its bound by a load spike: the failed tests run
# once more, and a failure that does not come again is reported as such, not blamed on a release
# (a release that breaks ricochet fails both times).
run() {
    local cache=(-o cache_dir=.pytest_cache-newest)
    "$venv/bin/python" -m pytest "${cache[@]}" "$@" && return 0
    echo "test-newest: $1: the failed tests once more" >&2
    if "$venv/bin/python" -m pytest "${cache[@]}" --last-failed "$@"; then
        echo "test-newest: $1 passed on the second run: the failure above did not come again" >&2
        return 0
    fi
    echo "test-newest: $1 fails with the newest releases: ${newer:-none newer than the lock}" >&2
    exit 1
}
run tests/unit -q "${@}"
run tests/integration -q --ignore=tests/integration/test_alert_rules.py \
    --ignore=tests/integration/test_install.py "${@}"
