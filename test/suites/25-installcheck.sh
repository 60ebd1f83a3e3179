#!/usr/bin/env bash
# 25-installcheck: `make installcheck` (the ecosystem's entry point, the one
# Debian's pg_buildext runs) as a DBA runs it: against a plain cluster of
# its own, not the harness's — initdb's defaults plus only what README asks
# for (shared_preload_libraries = 'im_sync') and settings a production
# server may carry (the relay's key in im_sync.push_public_key_file, its own
# page size, token lifetime, …; no im_sync.database, no paused workers) — with
# PGHOST/PGPORT/PGUSER set.  Every regression and isolation test must pass.
#   1. on that server without the preload: installcheck refuses, saying why;
#   2. on a preloading server whose new databases are SQL_ASCII: the same;
#   3. with the preload: the whole installcheck passes (outputs in a temp dir);
#   4. from a copy of the tree the server cannot read: the tests that hand
#      the server a file of the tree are skipped, saying why; the rest pass.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
root=$PWD
# PostgreSQL refuses to run as root: as root the server runs as `postgres`
if [ "$(id -u)" = 0 ]; then IM_AS_SERVER="runuser -u postgres --"; su=postgres; else IM_AS_SERVER=""; su=$(id -un); fi
fail() { echo "FAIL $*"; exit 1; }

work=$(mktemp -d /tmp/im_installcheck.XXXXXX)
chmod 755 "$work"
data=$work/data
port=$(im_free_port)
cleanup() {
  for d in "$data" "$work/ascii"; do
    [ -f "$d/postmaster.pid" ] && $IM_AS_SERVER "$PGBIN/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true
  done
  [ -n "${IM_KEEP:-}" ] && echo "files kept in $work" || rm -rf "$work"
}
trap cleanup EXIT
[ -n "$IM_AS_SERVER" ] && chown postgres "$work"
$IM_AS_SERVER "$PGBIN/initdb" -D "$data" >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log"; fail "initdb"; }
# where the server listens (its own port and socket directory), and fsync
# off for speed (nothing here tests durability); nothing else
printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = ''\nfsync = off\n" "$port" "$work" >>"$data/postgresql.conf"
pg() { $IM_AS_SERVER "$PGBIN/pg_ctl" -D "$data" -l "$work/server.log" -w -t 60 "$@" >/dev/null || { tail -n 20 "$work/server.log"; fail "pg_ctl $*"; }; }
export PGHOST=$work PGPORT=$port PGUSER=$su
unset PGDATABASE PGOPTIONS
ic() { make -s --no-print-directory installcheck PG_CONFIG="$PGBIN/pg_config" "$@"; }

# --- 1. not preloaded: a refusal that names the missing setting
pg start
if ic EXTRA_REGRESS_OPTS="--outputdir=$work/out0" >"$work/ic0.log" 2>&1; then
  cat "$work/ic0.log"; fail "installcheck ran on a server that does not preload im_sync"
fi
grep -q "shared_preload_libraries" "$work/ic0.log" || { cat "$work/ic0.log"; fail "the refusal does not say what is missing"; }
[ ! -e "$work/out0" ] || fail "installcheck started pg_regress on a server that does not preload im_sync"
echo "not preloaded: refused ($(grep -m1 shared_preload_libraries "$work/ic0.log"))"
pg stop -m fast

# --- 2. preloaded, but new databases are SQL_ASCII (initdb where no locale
# is set): the expected outputs hold UTF-8 text, so a refusal that says so
ascii=$work/ascii
$IM_AS_SERVER "$PGBIN/initdb" --no-sync -E SQL_ASCII --no-locale -D "$ascii" >"$work/initdb_ascii.log" 2>&1 \
  || { cat "$work/initdb_ascii.log"; fail "initdb -E SQL_ASCII"; }
printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = ''\nfsync = off\nshared_preload_libraries = 'im_sync'\n" \
  "$port" "$work" >>"$ascii/postgresql.conf"
$IM_AS_SERVER "$PGBIN/pg_ctl" -D "$ascii" -l "$work/server_ascii.log" -w -t 60 start >/dev/null || { cat "$work/server_ascii.log"; fail "start the SQL_ASCII cluster"; }
if ic EXTRA_REGRESS_OPTS="--outputdir=$work/out1" >"$work/ic1.log" 2>&1; then
  cat "$work/ic1.log"; fail "installcheck ran on a server whose new databases are SQL_ASCII"
fi
grep -q "SQL_ASCII.*UTF8" "$work/ic1.log" && [ ! -e "$work/out1" ] || { cat "$work/ic1.log"; fail "the refusal does not name the encoding"; }
echo "SQL_ASCII databases: refused ($(grep -m1 SQL_ASCII "$work/ic1.log"))"
$IM_AS_SERVER "$PGBIN/pg_ctl" -D "$ascii" -m fast -w stop >/dev/null

# --- 3. preloaded, with a production server's settings
cat >>"$data/postgresql.conf" <<EOF
shared_preload_libraries = 'im_sync'
im_sync.push_public_key_file = '$root/test/push/relay_pub.pem'
im_sync.max_page_bytes = '256kB'
im_sync.token_ttl = '5min'
im_sync.fanout_max_attempts = 10
im_sync.reconcile_outbox_age = '5min'
EOF
pg start
if ! ic EXTRA_REGRESS_OPTS="--outputdir=$work/out" >"$work/ic.log" 2>&1; then
  grep -E "^(test |not ok|ok )|FAILED|failed|installcheck" "$work/ic.log" | grep -v " ok " | head -n 40
  cat "$work/out/regression.diffs" 2>/dev/null | head -n 120
  fail "make installcheck fails on a plain server that preloads im_sync"
fi
nregress=$(ls sql/*.sql | wc -l); nisolation=$(ls test/isolation/specs/*.spec | wc -l)
grep -q "All $nregress tests passed" "$work/ic.log" && grep -q "All $nisolation tests passed" "$work/ic.log" \
  || { cat "$work/ic.log"; fail "installcheck did not run all $nregress regression and $nisolation isolation tests"; }
grep -q "the server sets im_sync.push_public_key_file" "$work/ic.log" || { cat "$work/ic.log"; fail "installcheck does not say which server settings it overrides"; }
echo "installcheck on a plain server with a relay key and production settings: $nregress regression and $nisolation isolation tests pass"

# --- 4. a tree the server cannot read (a DBA's private home, another host)
if [ -z "$IM_AS_SERVER" ]; then
  echo "unreadable tree: not checked (the server runs as this user and reads everything it does)"
  exit 0
fi
tree=$work/tree
mkdir -m 700 "$tree"
cp -a Makefile im_sync.control sql expected "$tree/"
mkdir -p "$tree/test/push" "$tree/test/harness"
cp -a test/harness/installcheck_preflight.sh "$tree/test/harness/"
cp -a test/isolation "$tree/test/"
cp -a test/push/*.pem "$tree/test/push/"
needs_tree=$(grep -l PG_ABS_SRCDIR sql/*.sql | xargs -r -n1 basename | sed "s/\.sql$//" | sort)
[ -n "$needs_tree" ] || fail "no regression test reads the source tree through the server (PG_ABS_SRCDIR)"
# those tests and one other; the isolation specs need no file of the tree
(cd "$tree" && ic REGRESS="00_install $(echo $needs_tree)" ISOLATION=) >"$work/ic3.log" 2>&1 \
  || { cat "$work/ic3.log"; fail "installcheck from a tree the server cannot read"; }
for t in $needs_tree; do
  grep -q "skipping $t: the server cannot read the source tree" "$work/ic3.log" || { cat "$work/ic3.log"; fail "$t was not skipped, saying why"; }
  grep -q "^test $t " "$work/ic3.log" && { cat "$work/ic3.log"; fail "$t ran although the server cannot read the tree"; }
done
grep -q "All 1 tests passed" "$work/ic3.log" || { cat "$work/ic3.log"; fail "00_install did not pass alone"; }
echo "unreadable tree: skipped $(echo $needs_tree), saying why; the rest passed"
