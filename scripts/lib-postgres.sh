# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/demo.sh: starts a throwaway PostgreSQL
# cluster listening on a Unix socket in a temporary directory, installing
# Debian's postgresql package first when no server binaries are found.
#
# After dama_pg_start, DAMA_PG_URL names a superuser connection to the
# cluster's "postgres" database; dama_pg_stop stops the cluster and removes it.

# The cluster's own state, set by dama_pg_start: never the environment's,
# which dama_pg_stop would otherwise run pg_ctl from and remove.
DAMA_PG_DIR= DAMA_PG_BINDIR= DAMA_PG_USER=

dama_pg_bindir() {
	local dir
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
			echo "$dir"
			return 0
		fi
	done
	return 1
}

dama_pg_install() {
	if dama_pg_bindir >/dev/null; then
		return 0
	fi
	echo "PostgreSQL server binaries not found: installing Debian's postgresql package" >&2
	local sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null || { echo "need root (or sudo) to install postgresql" >&2; return 1; }
		sudo="sudo"
	fi
	$sudo apt-get update -qq >&2 &&
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2 ||
		{ echo "installing postgresql failed" >&2; return 1; }
	dama_pg_bindir >/dev/null
}

# dama_pg_as runs a command as the unprivileged user that owns the cluster:
# initdb and postgres refuse to run as root.
dama_pg_as() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u "$DAMA_PG_USER" -- "$@"
	else
		"$@"
	fi
}

dama_pg_start() {
	dama_pg_install || return 1
	local bindir
	bindir=$(dama_pg_bindir)
	DAMA_PG_DIR=$(mktemp -d /tmp/dama-pg.XXXXXX)
	if [ "$(id -u)" -eq 0 ]; then
		DAMA_PG_USER=postgres
		id -u "$DAMA_PG_USER" >/dev/null 2>&1 ||
			useradd --system --no-create-home --shell /usr/sbin/nologin "$DAMA_PG_USER"
		chown "$DAMA_PG_USER" "$DAMA_PG_DIR"
	else
		DAMA_PG_USER=$(id -un)
	fi
	chmod 755 "$DAMA_PG_DIR"
	dama_pg_as "$bindir/initdb" -D "$DAMA_PG_DIR/data" -U postgres -A trust -E UTF8 --no-sync >"$DAMA_PG_DIR/initdb.log" 2>&1 ||
		{ cat "$DAMA_PG_DIR/initdb.log" >&2; return 1; }
	# fsync off: the cluster is thrown away; max_connections: every running
	# task holds two connections. DAMA_PG_OPTIONS adds server options.
	dama_pg_as "$bindir/pg_ctl" -D "$DAMA_PG_DIR/data" -l "$DAMA_PG_DIR/server.log" -w -t 60 \
		-o "-c listen_addresses='' -c unix_socket_directories='$DAMA_PG_DIR' -c max_connections=600 -c fsync=off -c synchronous_commit=off -c full_page_writes=off ${DAMA_PG_OPTIONS:-}" \
		start >/dev/null ||
		{ cat "$DAMA_PG_DIR/server.log" >&2; return 1; }
	DAMA_PG_BINDIR=$bindir
	DAMA_PG_URL="postgres://postgres@/postgres?host=$DAMA_PG_DIR&sslmode=disable"
	export DAMA_PG_URL
}

dama_pg_stop() {
	[ -n "${DAMA_PG_DIR:-}" ] || return 0
	dama_pg_as "$DAMA_PG_BINDIR/pg_ctl" -D "$DAMA_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$DAMA_PG_DIR"
	DAMA_PG_DIR=
}

# dama_pg_use VAR: export VAR as is when it is set, or else start a throwaway
# cluster (stopped when the calling script exits) and export VAR naming it.
dama_pg_use() {
	local var=$1
	if [ -z "${!var:-}" ]; then
		trap dama_pg_stop EXIT
		dama_pg_start || return 1
		printf -v "$var" '%s' "$DAMA_PG_URL"
	fi
	export "${var?}"
}
