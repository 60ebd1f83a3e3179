#!/usr/bin/env bash
# pgTAP invariant tests (test/pgtap/*.sql), run by pg_prove.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
files=$(ls test/pgtap/*.sql 2>/dev/null)
[ -n "$files" ] || { echo "no pgTAP files"; exit 1; }
im_createdb im_tap pgtap
pg_prove -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d im_tap $files
