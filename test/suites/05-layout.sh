#!/usr/bin/env bash
# The tree as extension/doc/architecture.md describes it: every .c/.h of
# extension/ and gateway/ in its code map (and nothing named that is gone),
# includes that never go up a layer, unique source names.  No server needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 test/layout/check_layout.py
