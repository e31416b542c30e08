#!/usr/bin/env bash
# Installs everything XG needs on a fresh Debian host, idempotently:
#   - a project virtualenv (.venv) with torch==2.13.0 (CPU wheel) and triton==3.6.0, then XG itself
#     (editable, every extra: `.[dev]`) with the rest pinned by requirements.lock (tools/lock.py);
#   - Debian's bazel-bootstrap (Bazel 4.2.3) and nginx (the test remote cache server);
#   - bazelisk from the npm registry, under .tools/.
# Nothing is downloaded from anywhere but PyPI, Debian's archive and the npm registry.
# A second run with nothing missing does no network work and takes about a second.
# The commands (xgc, xgrun, xgbuild) land in .venv/bin: the last line says how to put them on PATH.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${XG_PYTHON:-python3}"
BAZELISK_VERSION="1.28.1"

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root to run: $*"; return 1; fi
}

# --- Debian packages ------------------------------------------------------------------------
missing_debs=()
command -v bazel-4 >/dev/null 2>&1 || [ -x /usr/bin/bazel ] || missing_debs+=(bazel-bootstrap)
[ -x /usr/sbin/nginx ] || missing_debs+=(nginx)
if [ "${#missing_debs[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing_debs[*]}"
    as_root apt-get update -qq
    # nginx's package starts a service on install; we never use that one, only our own instances.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing_debs[@]}" >/dev/null
    if command -v service >/dev/null 2>&1; then as_root service nginx stop >/dev/null 2>&1 || true; fi
fi

# --- bazelisk from npm ----------------------------------------------------------------------
if [ ! -x "$ROOT/.tools/node_modules/.bin/bazelisk" ]; then
    if command -v npm >/dev/null 2>&1; then
        log "installing @bazel/bazelisk@$BAZELISK_VERSION into .tools/"
        mkdir -p "$ROOT/.tools"
        npm install --silent --no-audit --no-fund --prefix "$ROOT/.tools" \
            "@bazel/bazelisk@$BAZELISK_VERSION" >/dev/null 2>&1 \
            || log "warning: npm could not install bazelisk; plain bazel still works"
    else
        log "warning: npm not found; skipping bazelisk (plain bazel still works)"
    fi
fi

# --- the virtualenv ---------------------------------------------------------------------------
stamp="$VENV/.xg-deps-stamp"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements.lock" "$ROOT/setup.py" | sha256sum | cut -c1-64)"
installed=0
if [ ! -x "$VENV/bin/python" ]; then
    log "creating .venv with $($PY --version)"
    "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing Python dependencies into .venv (first run takes a few minutes; log: .venv/setup.log)"
    pip_install() {
        if ! "$VENV/bin/python" -m pip install -q --no-cache-dir "$@" >>"$VENV/setup.log" 2>&1; then
            tail -n 40 "$VENV/setup.log" >&2
            log "pip install $* failed (full log: $VENV/setup.log)"
            exit 1
        fi
    }
    : > "$VENV/setup.log"
    pip_install --upgrade pip setuptools wheel
    # torch and Triton first and by exact version: this host's CPU wheel of torch 2.13, never the
    # CUDA build from the index (which would bring Triton 3.7 and CUDA 13's wheels), and the Triton
    # the tests have always run. pyproject.toml's ranges accept this pair and the index's own pairs.
    pip_install "torch==2.13.0" "triton==3.6.0"
    # compat mode puts the checkout on sys.path, so packages added later import without a reinstall.
    pip_install -e "$ROOT[dev]" -c "$ROOT/requirements.lock" --config-settings editable_mode=compat
    echo "$want" > "$stamp"
    installed=1
fi

# Said on a terminal and after an install; tools/test and CI call the commands by their path.
if [ -t 2 ] || [ "$installed" = 1 ]; then
    log "ready: put XG's commands (xgc, xgrun, xgbuild) on PATH with:  source .venv/bin/activate"
    log "  (or: export PATH=\"$VENV/bin:\$PATH\")"
fi
