#!/usr/bin/env bash
# Model test of the device sync protocol (test/model/model_test.py): random
# sends, recalls, edits, joins, leaves, fanout runs, partial syncs, crashes,
# lost ACKs, rollbacks, reinstalls and GC; every device must converge to
# fetch_messages.  Fixed seeds, pinned (seed, steps) regressions, plus one
# random seed (printed, replayable).
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_createdb im_model
IM_MODEL_DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_model" \
  /usr/bin/python3 test/model/model_test.py --steps "${IM_MODEL_STEPS:-500}" ${IM_MODEL_ARGS:-}
