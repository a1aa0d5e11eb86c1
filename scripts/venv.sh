# shellcheck shell=bash
# The one .venv both scripts/dev and scripts/test run in, sourced by each: whichever runs first
# installs everything either needs, so the README's two commands work in either order.
#
# A venv of its own, not --system-site-packages: the runtime dependencies pinned in
# requirements.lock (as in the image), then notifier itself, editable, with its dev tools and the
# benchmarks' field (PgQueuer, which mypy checks bench/ against). Only a changed pyproject.toml,
# requirements.lock or set of extras needs another install.

PYTHON=${PYTHON:-python3}
VENV=.venv
VENV_EXTRAS=dev,bench

setup_venv() {
    if [[ ! -x $VENV/bin/python ]]; then
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
            die "notifier needs Python 3.11 or newer; name one with PYTHON=python3.11"
        echo "==> creating $VENV"
        "$PYTHON" -m venv "$VENV" || die "could not create $VENV"
    fi
    if [[ ! -e $VENV/.installed || pyproject.toml -nt $VENV/.installed ||
        requirements.lock -nt $VENV/.installed ||
        $(cat "$VENV/.installed") != "$VENV_EXTRAS" ]]; then
        echo "==> installing notifier and its dev tools into $VENV"
        # Two steps: the lock's hashes hold pip to hash-checking, which no editable install passes.
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            -r requirements.lock &&
            "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
                -e ".[$VENV_EXTRAS]" ||
            die "pip install failed"
        echo "$VENV_EXTRAS" >"$VENV/.installed"
    fi
}
