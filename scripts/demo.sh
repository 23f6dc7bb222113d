#!/usr/bin/env bash
# The demo: build dama, start a supervisor, submit a few sample ETL tasks,
# kill the supervisor with SIGKILL mid-run, start a new one, and watch it adopt
# the running tasks (same PIDs) and settle them.
#
# With --upgrade, the demo is a redeploy: the first supervisor and the tasks
# are of the previous release (CHANGELOG.md, built from this clone's own
# history), and the new supervisor is of this code, started after this
# code's `dama migrate`.
#
# Uses DATABASE_URL if set (its database gets dama's schema and the demo's
# tasks); otherwise starts a throwaway PostgreSQL cluster and removes it at
# the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

upgrade=
case "${1:-}" in
--upgrade) upgrade=1 ;;
"") ;;
*)
	echo "usage: $0 [--upgrade]" >&2
	exit 2
	;;
esac

work=$(mktemp -d /tmp/dama-demo.XXXXXX)
supervisor_pid=
cleanup() {
	if [ -n "$supervisor_pid" ]; then kill -TERM "$supervisor_pid" 2>/dev/null || true; wait "$supervisor_pid" 2>/dev/null || true; fi
	# Tasks outlive supervisors by design; the demo's own end them.
	pkill -KILL -f "$work/bin/" 2>/dev/null || true
	dama_pg_stop
	rm -rf "$work"
}
trap cleanup EXIT

if [ -z "${DATABASE_URL:-}" ]; then
	echo "== starting a throwaway PostgreSQL cluster"
	dama_pg_start
	DATABASE_URL=$DAMA_PG_URL
fi
export DATABASE_URL

echo "== building dama and the sample ETL program into $work/bin"
scripts/build.sh "$work/bin"
dama="$work/bin/dama"
first="$dama" # the first supervisor's, and the tasks', dama

if [ -n "$upgrade" ]; then
	# The newest release cut before HEAD, in HEAD's history.
	head=$(git rev-parse HEAD)
	prev= prev_version=
	while read -r version commit; do
		if [ "$commit" != "$head" ] && git merge-base --is-ancestor "$commit" HEAD 2>/dev/null; then
			prev=$commit prev_version=$version
			break
		fi
	done < <(awk '/^## \[[0-9]+\.[0-9]+\.[0-9]+\]/ { v = substr($2, 2, length($2) - 2) }
		/^Commit: / && v != "" { gsub(/`/, "", $2); print "v" v, $2; v = "" }' CHANGELOG.md)
	if [ -z "$prev" ]; then
		echo "demo: CHANGELOG.md records no release before HEAD in this clone's history" >&2
		exit 1
	fi
	echo "== building the previous release, $prev_version (commit $prev), from this clone's history"
	mkdir -p "$work/prev"
	git archive "$prev" | tar -x -C "$work/prev"
	(cd "$work/prev" && go build -ldflags "-X github.com/dama-etl/dama/version.commit=$prev" -o "$work/bin/dama-$prev_version" ./cmd/dama)
	first="$work/bin/dama-$prev_version"
	echo "   previous: $("$first" version | head -1), current: $("$dama" version | head -1)"
fi

# Run as root, the supervisor runs its commands as another user, never as
# root by accident: nobody, who may run the sample from here. (The
# previous release knows no user: setting, added before the redeploy.)
user=
if [ "$(id -u)" -eq 0 ]; then
	user="user: nobody"
	chmod 755 "$work" "$work/bin"
fi
cat >"$work/dama.yaml" <<YAML
${upgrade:+#}$user
log_dir: $work/logs
poll_interval: 1s
heartbeat_interval: 2s
queues:
  etl: { max_running: 4 }
kinds:
  sample:
    queue: etl
    command: ["$work/bin/sample-etl"]
    max_attempts: 3
YAML
export DAMA_CONFIG="$work/dama.yaml"

echo "== $(basename "$first") migrate"
"$first" migrate 2>"$work/migrate.log" || { cat "$work/migrate.log" >&2; exit 1; }

start_supervisor() {
	setsid "$1" supervisor >>"$work/supervisor.log" 2>&1 &
	supervisor_pid=$!
	echo "   supervisor pid $supervisor_pid ($("$1" version | head -1))"
}

echo "== starting a supervisor"
start_supervisor "$first"

echo "== submitting 3 tasks of kind sample (40 steps of 250ms each)"
ids=()
for _ in 1 2 3; do
	ids+=("$("$first" submit sample --args '{"steps": 40, "step_ms": 250}')")
done
echo "   etl_context_ids: ${ids[*]}"


running=0
for _ in $(seq 100); do
	running=$("$first" status --json | grep -c '"initial_event_locked": true' || true)
	[ "$running" -eq 3 ] && break
	sleep 0.2
done
sleep 2
echo "== all 3 running, each holding its lock:"
"$first" status
before=$("$first" status --json | grep -o '"etl_context_id": [0-9]*\|"pid": [0-9]*' | paste -d' ' - - | sort)

echo "== kill -9 the supervisor (pid $supervisor_pid)"
kill -KILL "$supervisor_pid"
wait "$supervisor_pid" 2>/dev/null || true
supervisor_pid=
sleep 1
echo "== the tasks are still running without it:"
ps -o pid,ppid,etime,args -p "$(echo "$before" | awk '{print $4}' | paste -sd, -)"

if [ -n "$upgrade" ]; then
	echo "== the redeploy: this code's dama migrate, while $prev_version's tasks run"
	"$dama" migrate 2>"$work/migrate.log" || { cat "$work/migrate.log" >&2; exit 1; }
	sed -i "s/^#$user\$/$user/" "$work/dama.yaml"
fi
echo "== starting a new supervisor: it adopts the running tasks"
start_supervisor "$dama"

for _ in $(seq 120); do
	sleep 2
	echo "--- $(date +%T)"
	"$dama" status
	if [ "$("$dama" status --json | grep -c '"etl_status": "DONE"')" -eq 3 ]; then
		break
	fi
done
after=$("$dama" status --json | grep -o '"etl_context_id": [0-9]*\|"pid": [0-9]*' | paste -d' ' - - | sort)

echo "== task PIDs before the kill and at the end:"
paste <(echo "$before") <(echo "$after")
if [ "$before" != "$after" ]; then
	echo "FAIL: a task was started again" >&2
	exit 1
fi
echo "== every task ran exactly once, across the supervisor's crash: the same PIDs, all DONE"
if [ -n "$upgrade" ]; then
	echo "== ... run by task processes of $prev_version, settled by $("$dama" version | head -1):"
	"$dama" status --json | grep -o '"etl_context_id": [0-9]*\|"runner_release": "[^"]*"' | paste -d' ' - -
fi
echo "== events of task ${ids[0]}:"
"$dama" events "${ids[0]}" | sed -n '1,4p;$p'
