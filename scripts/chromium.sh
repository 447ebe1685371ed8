#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (Playwright drives
# /usr/bin/chromium; it never downloads a browser). Installed once with apt-get
# when missing and this shell may install packages; otherwise the browser tests
# skip and say why.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[setup] no /usr/bin/chromium and no apt-get: the browser tests will skip" >&2
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "[setup] no /usr/bin/chromium and no root to install it: the browser tests will skip" >&2
    exit 0
  fi
fi
echo "[setup] installing Debian's chromium for the browser tests (about a minute)" >&2
log="$(mktemp)"
if ! { "${sudo[@]}" apt-get update -q && \
       DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q \
         chromium; } >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "[setup] apt-get could not install chromium (log above): the browser tests will skip" >&2
fi
rm -f "$log"
