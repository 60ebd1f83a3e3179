#!/usr/bin/env bash
# 73-schema-policy: the SQL policy of extension/doc/upgrades.md.
#   1. test/upgrade/schema_policy.py: extension/schema/ and
#      extension/router/schema/ only create (no DROP, no ALTER that changes a
#      definition, no data change; the script names what is allowed); every
#      released script (releases.txt, router_releases.txt, at its release
#      commit) is byte-identical to its file in updates/ where that still
#      exists; updates/ holds the frozen base and a chain to the current
#      version; the generated install scripts are not committed;
#   2. the extension directory the suites run against holds exactly this
#      tree's scripts: the generated ones as make generates them from
#      schema/ now, the others as in updates/, and no other script of either
#      extension (a full script left by an older install would be taken
#      instead of the chain from the base, e.g. by CREATE EXTENSION im_sync
#      VERSION '1.1').
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "FAIL $*"; exit 1; }

/usr/bin/python3 test/upgrade/schema_policy.py

ext=$(pg_config --sharedir)/extension
version() { sed -n "s/^default_version = '\(.*\)'/\1/p" "$1"; }
node=$(version im_sync.control)
router=$(version extension/router/im_sync_router.control)
work=$(mktemp -d /tmp/im_schema_policy.XXXXXX)
trap 'rm -rf "$work"' EXIT
# the generated scripts, made here from the sources (not the tree's build)
make -s "extension/im_sync--$node.sql" "extension/router/im_sync_router--$router.sql" \
  >/dev/null || fail "make cannot generate the install scripts"
expected=()
for f in extension/updates/im_sync--*.sql "extension/im_sync--$node.sql" \
         extension/router/updates/im_sync_router--*.sql "extension/router/im_sync_router--$router.sql"; do
  expected+=("$(basename "$f")")
  cmp -s "$f" "$ext/$(basename "$f")" \
    || fail "the installed $(basename "$f") is not this tree's $f (make install first)"
done
for f in "$ext"/im_sync--*.sql "$ext"/im_sync_router--*.sql; do
  [ -e "$f" ] || continue
  [[ " ${expected[*]} " == *" $(basename "$f") "* ]] \
    || fail "$ext holds $(basename "$f"), which this tree does not install (make install removes it)"
done
echo "ok   installed: ${#expected[@]} scripts, exactly this tree's (im_sync $node, im_sync_router $router generated from schema/)"
