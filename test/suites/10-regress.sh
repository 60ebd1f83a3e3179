#!/usr/bin/env bash
# pg_regress: sql/*.sql against expected/*.out, fanout workers paused.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
tests=$(ls sql/*.sql 2>/dev/null | xargs -n1 basename | sed 's/\.sql$//' | sort)
[ -n "$tests" ] || { echo "no pg_regress tests"; exit 1; }
PGXS_DIR=$(dirname "$(pg_config --pgxs)")/..
"$PGXS_DIR/test/regress/pg_regress" --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" \
  --bindir="$PGBIN" --inputdir=. --outputdir="$IM_TMP/regress" --dbname=im_regress \
  --load-extension=btree_gist --load-extension=im_sync $tests \
  || { cat "$IM_TMP/regress/regression.diffs" 2>/dev/null | head -200; exit 1; }
