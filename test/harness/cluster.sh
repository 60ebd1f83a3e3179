# test/harness/cluster.sh — sourced by the test, run and bench scripts: a throwaway
# PostgreSQL 15 cluster in a temp directory on a free port.  PostgreSQL
# refuses to run as root, so as root the server runs as the `postgres` OS
# user; client tools run as the caller and connect over TCP.

PGBIN=${PGBIN:-$(pg_config --bindir)}
IM_ROOT=${IM_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}

im_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# im_cluster_start [extra postgresql.conf lines...]
# Sets IM_TMP, PGDATA, PGHOST, PGPORT, PGUSER and exports them.
im_cluster_start() {
  IM_TMP=$(mktemp -d /tmp/im_sync.XXXXXX)
  chmod 755 "$IM_TMP"
  PGDATA=$IM_TMP/data
  PGPORT=$(im_free_port)
  PGHOST=127.0.0.1
  PGUSER=postgres
  export IM_TMP PGDATA PGPORT PGHOST PGUSER
  if [ "$(id -u)" = 0 ]; then
    IM_AS_SERVER="runuser -u postgres --"
    chown postgres "$IM_TMP"
  else
    IM_AS_SERVER=""
  fi
  $IM_AS_SERVER "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$IM_TMP/initdb.log" 2>&1 \
    || { cat "$IM_TMP/initdb.log"; return 1; }
  {
    echo "port = $PGPORT"
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$IM_TMP'"
    echo "max_connections = 300"
    echo "shared_buffers = 256MB"
    echo "max_worker_processes = 16"
    # Tests run without fsync (speed, throwaway data); benchmarks pass
    # IM_FSYNC=on (im_bench_cluster_start) to run at production durability.
    echo "fsync = ${IM_FSYNC:-off}"
    echo "shared_preload_libraries = 'im_sync'"
    echo "im_sync.database = 'im_test'"
    echo "log_line_prefix = '%m [%p] %q%a '"
    echo "log_min_messages = warning"
    for line in "$@"; do echo "$line"; done
    # extra settings for one run (e.g. auto_explain while profiling a benchmark)
    [ -n "${IM_EXTRA_CONF:-}" ] && printf '%s\n' "$IM_EXTRA_CONF"
  } >>"$PGDATA/postgresql.conf"
  im_cluster_pg_ctl start || { cat "$IM_TMP/server.log"; return 1; }
}

# Benchmarks: production durability (fsync, synchronous_commit and
# full_page_writes on) unless the script got --fsync-off (IM_BENCH_FSYNC=off),
# the old variant kept for comparison.  im_bench_durability prints the
# settings the server really runs with, for each script's header.
im_bench_parse_args() {
  for a in "$@"; do
    case "$a" in
      --fsync-off) IM_BENCH_FSYNC=off ;;
      *) echo "unknown argument: $a (known: --fsync-off)" >&2; return 2 ;;
    esac
  done
  export IM_BENCH_FSYNC=${IM_BENCH_FSYNC:-on}
}
im_bench_cluster_start() {
  IM_FSYNC=${IM_BENCH_FSYNC:-on} im_cluster_start "synchronous_commit = on" "full_page_writes = on" "$@"
}
im_bench_durability() {
  "$PGBIN/psql" -X -At -d postgres -c "SELECT 'durability: fsync = ' || current_setting('fsync')
      || ', synchronous_commit = ' || current_setting('synchronous_commit')
      || ', full_page_writes = ' || current_setting('full_page_writes')
      || ', wal_sync_method = ' || current_setting('wal_sync_method')"
}

im_cluster_pg_ctl() {
  $IM_AS_SERVER "$PGBIN/pg_ctl" -D "$PGDATA" -l "$IM_TMP/server.log" -w -t 60 "$@" >/dev/null
}

im_cluster_stop() {
  [ -n "${PGDATA:-}" ] && [ -f "$PGDATA/postmaster.pid" ] && im_cluster_pg_ctl -m fast stop || true
}

im_cluster_destroy() {
  im_cluster_stop
  [ -n "${IM_TMP:-}" ] && [ -z "${IM_KEEP:-}" ] && rm -rf "$IM_TMP"
}

# im_createdb NAME [extensions...]: fresh database with im_sync installed.
im_createdb() {
  local db=$1; shift
  "$PGBIN/psql" -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  "$PGBIN/psql" -X -q -d "$db" -v ON_ERROR_STOP=1 -c "CREATE EXTENSION im_sync CASCADE" >/dev/null
  for ext in "$@"; do
    "$PGBIN/psql" -X -q -d "$db" -v ON_ERROR_STOP=1 -c "CREATE EXTENSION $ext" >/dev/null
  done
}

im_psql() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
