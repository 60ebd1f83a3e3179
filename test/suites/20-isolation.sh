#!/usr/bin/env bash
# Isolation tester: test/isolation/specs/*.spec — real interleavings of
# concurrent sessions, never sleeps.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
tests=$(ls test/isolation/specs/*.spec 2>/dev/null | xargs -n1 basename | sed 's/\.spec$//' | sort)
[ -n "$tests" ] || { echo "no isolation specs"; exit 1; }
PGXS_DIR=$(dirname "$(pg_config --pgxs)")/..
"$PGXS_DIR/test/isolation/pg_isolation_regress" --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" \
  --bindir="$PGBIN" --inputdir=test/isolation --outputdir="$IM_TMP/isolation" --dbname=im_isolation \
  --load-extension=btree_gist --load-extension=im_sync $tests \
  || { cat "$IM_TMP/isolation/output_iso/regression.diffs" "$IM_TMP/isolation/regression.diffs" 2>/dev/null | head -200; exit 1; }
