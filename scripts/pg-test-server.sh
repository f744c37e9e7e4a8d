# shellcheck shell=bash
# Throwaway PostgreSQL server for integration tests (loopback TCP only, trust auth, no durability).
#   . scripts/pg-test-server.sh
#   trap 'pg_stop; stop_services' EXIT     # set the trap BEFORE pg_start: a failure midway still stops it
#   pg_start                               # exports IRONFLOW_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:PORT
# Run directly (`bash pg-test-server.sh`) it does a self-test: start, 20 x CREATE/DROP DATABASE,
# 40 concurrent connections, stop.
# Knobs: PG_TEST_ROOT (default $PWD/target/pg-test: data/ + server.log, wiped at every start),
#        PG_TEST_OS_USER (default postgres; only used when running as root).

pg__log() { echo "pg-test: $*" >&2; }

# Run a command as the unprivileged OS user (the server refuses to run as root). `cd /` first:
# postgres cannot enter root's cwd (e.g. /root is 0700) and initdb/postgres complain about it.
pg__as() {
  if [ "$(id -u)" -ne 0 ]; then (cd / && "$@"); return; fi
  if command -v runuser >/dev/null; then
    (cd / && runuser -u "$PG_TEST_OS_USER" -- "$@")
  else
    (cd / && su -s /bin/sh "$PG_TEST_OS_USER" -c "$(printf '%q ' "$@")")
  fi
}

# Newest /usr/lib/postgresql/<v>/bin holding the server binaries (psql alone is not enough).
pg__find_bindir() {
  local d
  for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  return 1
}

pg__install() {
  if [ "$(id -u)" -ne 0 ]; then
    pg__log "error: PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/{initdb,pg_ctl})"
    pg__log "       and not root, so cannot apt-get them: run 'sudo apt-get install postgresql' once"
    return 1
  fi
  command -v apt-get >/dev/null || { pg__log "error: no apt-get; install the PostgreSQL server by hand"; return 1; }
  pg__log "installing PostgreSQL server (apt-get install postgresql; log: $PG_TEST_ROOT.apt.log)"
  # 'update' first: on a fresh machine the package lists may be missing or stale (404s).
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql
  } >"$PG_TEST_ROOT.apt.log" 2>&1 || { tail -n 30 "$PG_TEST_ROOT.apt.log" >&2; pg__log "error: apt-get failed"; return 1; }
}

pg__free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pg_start() {
  local root bindir data port attempt
  PG_TEST_OS_USER=${PG_TEST_OS_USER:-postgres}
  root=$(readlink -m "${PG_TEST_ROOT:-$PWD/target/pg-test}")
  PG_TEST_ROOT=$root
  mkdir -p "$(dirname "$root")" || return 1

  if ! bindir=$(pg__find_bindir); then
    pg__install || return 1
    bindir=$(pg__find_bindir) ||
      { pg__log "error: no initdb/pg_ctl under /usr/lib/postgresql/*/bin even after installing"; return 1; }
  fi

  if [ "$(id -u)" -eq 0 ] && ! id -u "$PG_TEST_OS_USER" >/dev/null 2>&1; then
    pg__log "error: OS user '$PG_TEST_OS_USER' missing (Debian's postgresql-common package creates it)."
    pg__log "       Create it: adduser --system --group --home /var/lib/postgresql $PG_TEST_OS_USER,"
    pg__log "       or set PG_TEST_OS_USER to another unprivileged user."
    return 1
  fi

  # Stale server from a killed run (SIGKILL skips traps): stop it before wiping its data dir.
  pg__stop_dir "$bindir" "$root/data"
  rm -rf "$root" && mkdir -p "$root" || return 1
  [ "$(id -u)" -eq 0 ] && { chown "$PG_TEST_OS_USER:" "$root" || return 1; }
  chmod 700 "$root"
  # The OS user must reach the folder (an ancestor may be 0700, e.g. a clone under /root):
  # fall back to a fixed per-project folder in /tmp so stale-server cleanup still finds it.
  if ! pg__as test -w "$root"; then
    rm -rf "$root"
    root="${TMPDIR:-/tmp}/pg-test-$(printf '%s' "$root" | cksum | cut -d' ' -f1)"
    pg__log "'$PG_TEST_OS_USER' cannot reach $PG_TEST_ROOT; using $root"
    PG_TEST_ROOT=$root
    pg__stop_dir "$bindir" "$root/data"
    rm -rf "$root" && mkdir -p "$root" && chown "$PG_TEST_OS_USER:" "$root" && chmod 700 "$root" || return 1
  fi
  data=$root/data

  # trust auth: any local user may connect over loopback as superuser 'postgres', no password.
  # Fine for a throwaway server that only listens on 127.0.0.1 and holds test data only.
  pg__as "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync \
    >"$root/initdb.log" 2>&1 || { cat "$root/initdb.log" >&2; pg__log "error: initdb failed"; return 1; }
  # No Unix socket (the default /var/run/postgresql may not exist, and socket paths have a
  # 107-byte limit); no durability: a crash just means a new run.
  cat >>"$data/postgresql.conf" <<'CONF' || return 1
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
CONF

  # Port picked then bound by postgres: another process may take it in between, so retry.
  for attempt in 1 2 3 4 5; do
    port=$(pg__free_port) || return 1
    if pg__as "$bindir/pg_ctl" -D "$data" -l "$root/server.log" -o "-p $port" -w -t 60 start >/dev/null; then
      break
    fi
    if [ "$attempt" -lt 5 ] && grep -q 'could not bind\|already in use' "$root/server.log"; then
      pg__log "port $port taken, retrying"; continue
    fi
    tail -n 30 "$root/server.log" >&2; pg__log "error: server did not start (log: $root/server.log)"; return 1
  done
  "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -t 30 ||
    { tail -n 30 "$root/server.log" >&2; pg__log "error: server not accepting connections"; return 1; }

  export PG_TEST_BINDIR=$bindir PG_TEST_DATA=$data PG_TEST_PORT=$port
  export IRONFLOW_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port"
  pg__log "PostgreSQL $("$bindir/postgres" -V | awk '{print $3}') up at $IRONFLOW_TEST_POSTGRES_URL (log: $root/server.log)"
}

# Stop whatever server owns this data dir, if any; never fails.
pg__stop_dir() {
  [ -f "$2/postmaster.pid" ] || return 0
  pg__as "$1/pg_ctl" -D "$2" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
}

# For the EXIT trap: idempotent, keeps the exit status, keeps server.log, frees the data dir.
pg_stop() {
  # From another shell than pg_start's: the server of PG_TEST_ROOT (default target/pg-test).
  PG_TEST_OS_USER=${PG_TEST_OS_USER:-postgres}
  local data=${PG_TEST_DATA:-$(readlink -m "${PG_TEST_ROOT:-$PWD/target/pg-test}")/data}
  local bindir=${PG_TEST_BINDIR:-$(pg__find_bindir)} || return 0
  [ -d "$data" ] || return 0
  pg__stop_dir "$bindir" "$data"
  rm -rf "$data"
  unset PG_TEST_DATA
  return 0
}

# ---- self-test when executed, not sourced ----------------------------------------------------
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cd "$(dirname "$0")"
  trap pg_stop EXIT
  trap 'exit 130' INT; trap 'exit 143' TERM     # make signals run the EXIT trap too
  el() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }
  t0=$(date +%s.%N); pg_start; t1=$(date +%s.%N)
  echo "pg_start: $(el "$t0" "$t1") s"
  q() { "$PG_TEST_BINDIR/psql" "$IRONFLOW_TEST_POSTGRES_URL/postgres" -X -q -v ON_ERROR_STOP=1 -At "$@"; }
  q -c 'select version()'
  q -c "select name||'='||setting from pg_settings where name in
        ('max_connections','fsync','synchronous_commit','full_page_writes','listen_addresses')"
  t0=$(date +%s.%N)
  for n in $(seq 1 20); do q -c "CREATE DATABASE test_$n"; done
  t1=$(date +%s.%N)
  [ "$(q -c "select count(*) from pg_database where datname like 'test\_%'")" = 20 ]
  for n in $(seq 1 20); do q -c "DROP DATABASE test_$n"; done
  t2=$(date +%s.%N)
  echo "20 x CREATE DATABASE: $(el "$t0" "$t1") s; 20 x DROP: $(el "$t1" "$t2") s"
  pids=()
  for n in $(seq 1 40); do q -c 'select pg_sleep(3)' >/dev/null & pids+=($!); done
  sleep 1.5
  echo "concurrent client backends: $(q -c "select count(*) from pg_stat_activity where backend_type='client backend'")"
  for p in "${pids[@]}"; do wait "$p"; done
  echo "self-test OK"
fi
