#!/usr/bin/env bash
# test/harness/installcheck_preflight.sh PSQL TESTDB... — the Makefile runs this
# before `make installcheck` (the server given by PGHOST/PGPORT/PGUSER, from
# the top of the source tree) and reads its standard output, one word each:
#   -c name=value   for PGOPTIONS: every im_sync setting a session may set,
#                   at its built-in value (pg_settings.boot_val).  The
#                   expected outputs assume the built-in values; a server
#                   configured for production (a relay key in
#                   im_sync.push_public_key_file, a larger page size, …)
#                   must not change them.  The tests' own SETs still apply.
#   skip:TEST       a regression test this server cannot run (the reason is
#                   on standard error)
#   refused         the server does not meet the preconditions (why: on
#                   standard error); installcheck must not run
# Messages go to standard error, which make shows.
set -uo pipefail
psql=$1; shift
say() { echo "installcheck: $*" >&2; }
refuse() { say "$*"; echo refused; exit 0; }
q() { "$psql" -X -q -At -v ON_ERROR_STOP=1 -d postgres "$@" 2>&1; }

if ! out=$(q -c "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"); then
  refuse "cannot connect to the server (PGHOST=${PGHOST-} PGPORT=${PGPORT-} PGUSER=${PGUSER-}): $out"
fi
[ "$out" = t ] || refuse "PGUSER must be a superuser: the tests create databases and roles and set superuser-only im_sync settings"

# the library was preloaded only if its worker settings are postmaster-level
preload=$(q -c "LOAD 'im_sync'" -c "SELECT context FROM pg_settings WHERE name = 'im_sync.database'") \
  || refuse "the server cannot load im_sync (make install on the server's host first): $preload"
[ "$preload" = postmaster ] \
  || refuse "the server does not preload im_sync: set shared_preload_libraries = 'im_sync' and restart it"

# the expected outputs hold UTF-8 text (emoji reactions, '…'), whose length
# and width depend on the database encoding; the tests' databases copy
# template0 (pg_regress's) and template1 (the ones the tests create)
enc=$(q -c "SELECT string_agg(DISTINCT pg_encoding_to_char(encoding), ',') FROM pg_database WHERE datname IN ('template0', 'template1')")
[ "$enc" = UTF8 ] \
  || refuse "the server's new databases are $enc (template0/template1), the tests need UTF8 ones: run installcheck on a cluster made with initdb -E UTF8"

# the tests create their databases from template1 and then the extensions
extensions=$(q -d template1 -c "SELECT string_agg(extname, ', ' ORDER BY extname) FROM pg_extension WHERE extname IN ('im_sync', 'btree_gist')")
[ -z "$extensions" ] \
  || refuse "template1 already holds $extensions: the tests create these extensions in new databases; drop them from template1"

# its workers run in im_sync.database: never one of the test databases
workerdb=$(q -c "SHOW im_sync.database")
for db in "$@" $(sed -n 's/^CREATE DATABASE \([a-z_0-9]*\).*/\1/p' sql/*.sql test/isolation/specs/*.spec | sort -u); do
  [ "$workerdb" = "$db" ] && refuse "im_sync.database is '$db', a database the tests create: its fanout workers would run in it; point it at another database"
done

# settings a session may change, at their built-in values (spaces and
# backslashes escaped as PGOPTIONS wants them)
q -c "SELECT name, CASE WHEN setting IS DISTINCT FROM boot_val THEN setting END,
             '-c ' || name || '=' || replace(replace(boot_val, '\\', '\\\\'), ' ', '\\ ')
      FROM pg_settings WHERE name LIKE 'im_sync.%' AND context IN ('user', 'superuser') ORDER BY name" |
while IFS='|' read -r name server option; do
  [ -n "$server" ] && say "the server sets $name = '$server'; the tests run with its built-in value"
  echo "$option"
done

# tests that hand the server a path in the source tree (they read
# PG_ABS_SRCDIR, like PostgreSQL's own tests) need a server that can read
# the tree: on another host, or without read access, they are skipped
probe=test/push/relay_pub.pem
if ! out=$(q -c "SELECT length(pg_read_file('$(printf %s "$PWD/$probe" | sed "s/'/''/g")')) > 0"); then
  for t in $(grep -l PG_ABS_SRCDIR sql/*.sql); do
    t=$(basename "$t" .sql)
    say "skipping $t: the server cannot read the source tree ($probe: ${out##*ERROR:  })"
    echo "skip:$t"
  done
fi
exit 0
