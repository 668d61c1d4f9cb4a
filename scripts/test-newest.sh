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

run() {  # a suite, and on failure the packages that may have broken it
    if ! "$venv/bin/python" -m pytest "$@"; then
        echo "test-newest: $1 fails with the newest releases: ${newer:-none newer than the lock}" >&2
        exit 1
    fi
}
run tests/unit -q "${@}"
run tests/integration -q --ignore=tests/integration/test_alert_rules.py \
    --ignore=tests/integration/test_install.py "${@}"
