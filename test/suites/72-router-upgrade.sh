#!/usr/bin/env bash
# 72-router-upgrade: the router extension's version chain, against the
# suite's cluster (the router needs no preload).
#   1. the installed im_sync_router--<release>.sql, where the release is the
#      frozen base, is the released file (test/upgrade/router_releases.txt:
#      the commit that released it; 73-schema-policy compares every released
#      script with extension/router/updates/);
#   2. a router at the release, with a configured map (one node's password
#      holds the text "user="), then ALTER EXTENSION im_sync_router UPDATE;
#   3. its catalog (router_catalog_description.sql: functions with their
#      attributes and ACLs, tables, dblink's ACLs, the server's partitions)
#      equals a fresh install of the latest version configured with the same
#      map, and a fresh install on a database where dblink was created first;
#   4. on each, no dblink function and no SECURITY DEFINER function of the
#      router but im_router.probe is executable by a role without grants.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
# every release is upgraded in turn (IM_ROUTER_RELEASE=<version> picks one)
latest=$(sed -n "s/^default_version = '\(.*\)'/\1/p" extension/router/im_sync_router.control)
base_release=$(grep -v '^#' test/upgrade/router_releases.txt | head -n 1 | cut -d' ' -f1)
if [ -z "${IM_ROUTER_RELEASE:-}" ]; then
  for r in $(grep -v '^#' test/upgrade/router_releases.txt | cut -d' ' -f1); do
    IM_ROUTER_RELEASE=$r bash "$0" || exit 1
  done
  exit 0
fi
read -r release commit < <(grep -v '^#' test/upgrade/router_releases.txt | awk -v r="$IM_ROUTER_RELEASE" '$1 == r')
[ -n "$release" ] && [ -n "$commit" ] && [ -n "$latest" ] && [ "$release" != "$latest" ] \
  || { echo "no router release to upgrade from (router_releases.txt: '$release $commit', control: '$latest')"; exit 1; }
ext=$(pg_config --sharedir)/extension
for f in plproxy.control dblink.control im_sync_router.control; do
  [ -f "$ext/$f" ] || { echo "FAIL $f is not installed in $(pg_config --sharedir)"; exit 1; }
done
grep -q "^default_version = '$latest'" "$ext/im_sync_router.control" \
  || { echo "FAIL the installed im_sync_router is not this tree's (make install first)"; exit 1; }
fail() { echo "FAIL $*"; exit 1; }
q() { local db=$1; shift; PGOPTIONS='-c client_min_messages=warning' im_psql -d "$db" -At "$@"; }
work=$(mktemp -d /tmp/im_router_upgrade.XXXXXX)
dbs="im_router_up im_router_fresh im_router_dblink_first"
cleanup() {
  for db in $dbs; do q postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; done
  q postgres -c "DROP ROLE IF EXISTS im_router_nobody" >/dev/null 2>&1 || true
  [ -n "${IM_KEEP:-}" ] && echo "files kept in $work" || rm -rf "$work"
}
trap cleanup EXIT

# --- 1. the released script
git cat-file -e "$commit^{commit}" 2>/dev/null || fail "release commit $commit of router $release is not in this repository"
base=extension/router/updates/im_sync_router--$release.sql
if [ -f "$base" ]; then
  git show "$commit:extension/im_sync_router--$release.sql" >"$work/released.sql"
  cmp -s "$work/released.sql" "$ext/im_sync_router--$release.sql" \
    || fail "the installed im_sync_router--$release.sql differs from the one released in $commit"
  cmp -s "$work/released.sql" "$base" \
    || fail "$base changed since its release in $commit"
  echo "ok   im_sync_router--$release.sql is the released file ($commit)"
else
  echo "ok   router $release installs through the chain from the base (73-schema-policy checks the released scripts)"
fi

# the same map everywhere: two nodes, the second's password holds "user="
configure="SELECT im_router.configure(ARRAY['n1','n2'],
  ARRAY['host=127.0.0.1 port=1 dbname=im user=postgres',
        \$\$host=127.0.0.1 port=2 dbname=im user=postgres password='s3cr\\\\et\\'user=postgres'\$\$],
  (SELECT array_agg(CASE WHEN b % 2 = 0 THEN 'n1' ELSE 'n2' END ORDER BY b) FROM generate_series(0, 63) b))"
q postgres -c "DROP ROLE IF EXISTS im_router_nobody" -c "CREATE ROLE im_router_nobody LOGIN"
for db in $dbs; do q postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"; done

# --- 2. the release, configured, then updated
q im_router_up -c "CREATE EXTENSION im_sync_router VERSION '$release' CASCADE" -c "$configure" >/dev/null
# a DBA's grant on every write the update replaces (contract §21 added trace_id)
writes="im.send_message(bigint, bigint, text, jsonb, text, bigint), im.recall_message(bigint, bigint, text, bigint),
  im.edit_message(bigint, bigint, text, bigint, jsonb), im.react(bigint, bigint, bigint, text, boolean, text),
  im.pin_message(bigint, bigint, bigint, boolean, text), im.report_read(bigint, bigint, bigint),
  im.clear_dirty(bigint, bigint, bigint, bigint), im.delete_for_me(bigint, bigint, bigint)"
# (a release that has the trace_id signatures already has nothing to carry over)
old_writes=$(q im_router_up -c "SELECT to_regprocedure('im.send_message(bigint, bigint, text, jsonb, text, bigint)') IS NOT NULL")
[ "$old_writes" = t ] && q im_router_up -c "GRANT EXECUTE ON FUNCTION $writes TO im_router_nobody"
# the base release stored conninfos unescaped: its map must show the flaw the update repairs
[ "$release" != "$base_release" ] || [ "$(q im_router_up -c "SELECT count(*) FROM pg_foreign_server s, unnest(s.srvoptions) o
     WHERE s.srvname = 'im_sync' AND o LIKE '%user=%'")" -gt 0 ] \
  || fail "the $release map was expected to hold \"user=\" in a partition (the test's premise)"
q im_router_up -c "ALTER EXTENSION im_sync_router UPDATE"
[ "$(q im_router_up -c "SELECT extversion FROM pg_extension WHERE extname = 'im_sync_router'")" = "$latest" ] \
  || fail "ALTER EXTENSION im_sync_router UPDATE did not reach $latest"
# the grant is carried over to each replaced write (one function per name,
# trace_id last), then taken back so the catalogs compare
if [ "$old_writes" = t ]; then
granted=$(q im_router_up -c "SELECT string_agg(p.proname, ',' ORDER BY p.proname) FROM pg_proc p
   WHERE p.pronamespace = 'im'::regnamespace AND p.proargnames[p.pronargs] = 'trace_id'
     AND has_function_privilege('im_router_nobody', p.oid, 'EXECUTE')")
[ "$granted" = "clear_dirty,delete_for_me,edit_message,pin_message,react,recall_message,report_read,send_message" ] \
  || fail "the grants on the replaced writes were not carried over (granted: '$granted')"
q im_router_up -c "REVOKE EXECUTE ON FUNCTION $(echo "$writes" | sed 's/)/, text)/g') FROM im_router_nobody"
echo "ok   a grant on each write the update replaces is carried over to its trace_id signature"
fi

# --- 3. fresh installs of the latest version, configured the same
q im_router_fresh -c "CREATE EXTENSION im_sync_router CASCADE" -c "$configure" >/dev/null
q im_router_dblink_first -c "CREATE EXTENSION dblink" -c "CREATE EXTENSION im_sync_router CASCADE" -c "$configure" >/dev/null
for db in $dbs; do
  q $db -f test/upgrade/router_catalog_description.sql >"$work/catalog-$db.txt"
done
[ "$(grep -c '^function ' "$work/catalog-im_router_fresh.txt")" -gt 40 ] \
  && grep -q "^extension version=$latest " "$work/catalog-im_router_fresh.txt" \
  && grep -q "^dblink function " "$work/catalog-im_router_fresh.txt" \
  && grep -q "^server im_sync option p63=" "$work/catalog-im_router_fresh.txt" \
  || fail "the router's catalog description describes nothing"
for db in im_router_up im_router_dblink_first; do
  diff -u "$work/catalog-im_router_fresh.txt" "$work/catalog-$db.txt" >"$work/catalog-$db.diff" \
    || { head -n 60 "$work/catalog-$db.diff"; fail "$db differs from a fresh $latest (- fresh, + $db)"; }
done
echo "ok   router $release + ALTER EXTENSION UPDATE = fresh $latest = fresh $latest after dblink ($(wc -l <"$work/catalog-im_router_fresh.txt") lines compared)"

# --- 4. what a role without grants may run
for db in $dbs; do
  dbl=$(q $db -c "SELECT coalesce(string_agg(p.oid::regprocedure::text, ', '), '')
     FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
     JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'dblink'
    WHERE has_function_privilege('im_router_nobody', p.oid, 'EXECUTE')")
  [ -z "$dbl" ] || fail "$db: a role without grants may run dblink's $dbl"
  sd=$(q $db -c "SELECT coalesce(string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1), '')
     FROM pg_proc p WHERE p.pronamespace IN ('im'::regnamespace, 'im_router'::regnamespace) AND p.prosecdef
      AND has_function_privilege('im_router_nobody', p.oid, 'EXECUTE')")
  [ "$sd" = "im_router.probe(text)" ] || fail "$db: SECURITY DEFINER functions a role without grants may run: '$sd' (only im_router.probe(text) expected)"
  [ "$(q $db -c "SELECT count(*) FROM pg_foreign_server s, unnest(s.srvoptions) o
       WHERE s.srvname = 'im_sync' AND o LIKE '%user=%'")" = 0 ] \
    || fail "$db: a partition conninfo holds \"user=\" (PL/Proxy would then not connect as the caller)"
done
echo "ok   no dblink function, no SECURITY DEFINER function but im_router.probe for PUBLIC; no \"user=\" in any partition"
echo "router upgrade $release -> $latest: ok"
