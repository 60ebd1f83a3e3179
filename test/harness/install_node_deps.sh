#!/usr/bin/env bash
# The client's npm packages (gateway/package-lock.json) into gateway/node_modules,
# with `npm ci` (exact versions from the lockfile).  No package downloads a
# browser: the browser suite drives Debian's chromium (test/harness/deps.txt).
set -euo pipefail
cd "$(dirname "$0")/../../gateway"
command -v node >/dev/null || { echo "node is missing: the client tests need Node.js 20 or newer"; exit 1; }
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "node $(node --version) is too old: the client library and its tests need Node.js 20 or newer"; exit 1
fi
export PUPPETEER_SKIP_DOWNLOAD=1 PUPPETEER_SKIP_CHROME_DOWNLOAD=1 PUPPETEER_SKIP_CHROME_HEADLESS_SHELL_DOWNLOAD=1
# up to date when the tree was installed from this very lockfile
want=$(sha256sum package-lock.json | cut -d' ' -f1)
[ -f node_modules/.im_lock_sha256 ] && [ "$(cat node_modules/.im_lock_sha256)" = "$want" ] && exit 0
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > node_modules/.im_lock_sha256
