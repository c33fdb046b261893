#!/usr/bin/env bash
# The browser test (tests/test_browser.py, marker `browser`) drives Debian's Chromium with Playwright for
# Python. Installs Chromium with apt only when it is missing, and Playwright into the project's venv
# (VENV, default .venv); never `playwright install` (it would download a browser of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: chromium is missing and apt-get as root is not available" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "playwright==1.65.2"
echo "install-browser: $(chromium --version 2>/dev/null | head -1); playwright $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
