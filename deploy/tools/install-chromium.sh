#!/usr/bin/env bash
# Installs Chromium from Debian for the web page's browser test (tests/web); idempotent.
#
# Debian's package rather than `playwright install`: the test drives whatever `chromium` is on
# PATH, and the apt mirrors are reachable where Playwright's browser download site is not.
#
# Usage: bash deploy/tools/install-chromium.sh     (as root, or with passwordless sudo)
# Result: `chromium` on PATH
set -euo pipefail

if command -v chromium >/dev/null; then
  # Debian's wrapper script prints noise on stderr for --version; the version line is on stdout.
  echo "chromium: $(chromium --version 2>/dev/null || true) already at $(command -v chromium)"
  exit 0
fi

command -v apt-get >/dev/null || {
  echo "install-chromium: no apt-get here; install Chromium some other way so that \`chromium\` is on PATH" >&2
  exit 1
}
if [[ $EUID -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-chromium: chromium is missing and installing it needs root; run as root, allow $(id -un)" \
    "passwordless sudo, or run: sudo apt-get install --no-install-recommends chromium" >&2
  exit 1
fi

"${as_root[@]}" apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
command -v chromium >/dev/null || { echo "install-chromium: apt-get succeeded but chromium is not on PATH" >&2; exit 1; }
echo "chromium: installed $(chromium --version 2>/dev/null || true)"
