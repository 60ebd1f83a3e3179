#!/usr/bin/env bash
# Installs the Debian packages of test/harness/deps.txt that are missing.  As root it
# runs apt-get directly; otherwise it asks for sudo (packages only).
set -euo pipefail
cd "$(dirname "$0")"
missing=()
for p in $(grep -v '^#' deps.txt); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing missing packages: ${missing[*]}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
# only what is listed: prometheus, for one, would recommend an exporter and more
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
