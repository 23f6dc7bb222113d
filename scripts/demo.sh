#!/usr/bin/env bash
# The demo: build dama, start a supervisor, submit a few sample ETL tasks,
# kill the supervisor with SIGKILL mid-run, start a new one, and watch it adopt
# the running tasks (same PIDs) and settle them.
#
# Uses DATABASE_URL if set (its database gets dama's schema and the demo's
# tasks); otherwise starts a throwaway PostgreSQL cluster and removes it at
# the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

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

cat >"$work/dama.yaml" <<YAML
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

echo "== dama migrate"
"$dama" migrate 2>/dev/null

start_supervisor() {
	setsid "$dama" supervisor >>"$work/supervisor.log" 2>&1 &
	supervisor_pid=$!
	echo "   supervisor pid $supervisor_pid"
}

echo "== starting a supervisor"
start_supervisor

echo "== submitting 3 tasks of kind sample (40 steps of 250ms each)"
ids=()
for _ in 1 2 3; do
	ids+=("$("$dama" submit sample --args '{"steps": 40, "step_ms": 250}')")
done
echo "   etl_context_ids: ${ids[*]}"


running=0
for _ in $(seq 100); do
	running=$("$dama" status --json | grep -c '"initial_event_locked": true' || true)
	[ "$running" -eq 3 ] && break
	sleep 0.2
done
sleep 2
echo "== all 3 running, each holding its lock:"
"$dama" status
before=$("$dama" status --json | grep -o '"etl_context_id": [0-9]*\|"pid": [0-9]*' | paste -d' ' - - | sort)

echo "== kill -9 the supervisor (pid $supervisor_pid)"
kill -KILL "$supervisor_pid"
wait "$supervisor_pid" 2>/dev/null || true
supervisor_pid=
sleep 1
echo "== the tasks are still running without it:"
ps -o pid,ppid,etime,args -p "$(echo "$before" | awk '{print $4}' | paste -sd, -)"

echo "== starting a new supervisor: it adopts the running tasks"
start_supervisor

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
echo "== events of task ${ids[0]}:"
"$dama" events "${ids[0]}" | sed -n '1,4p;$p'
