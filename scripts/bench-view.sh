#!/usr/bin/env bash
# The view benchmark (docs/performance.md "How fast the view answers"): loads BENCH_VIEW_CONTEXTS
# (default 1,000,000) contexts into a fresh database, of which
# BENCH_VIEW_RUNNING (default 500) are RUNNING, BENCH_VIEW_QUEUED (default
# 0.5%) QUEUED, a tenth of them due later and a quarter of the due waiting
# for a slot, BENCH_VIEW_RETRYING (default 0.05%) RETRYING, and the rest
# finished; the running ones run on BENCH_VIEW_HOSTS (default 4) hosts, each
# with a serving supervisor in data_manager.supervisors (and one more, lost,
# the last to serve the rare kind audit). One idle session holds the
# running tasks' advisory locks, as task processes do, and the supervisors'
# liveness locks. It prints EXPLAIN (ANALYZE, BUFFERS) figures of the usual
# queries on data_manager.dama_task_queue (median of BENCH_VIEW_EXPLAIN_RUNS,
# default 5; 0: none), then the wall time of `dama status` (the other
# --status lists too with BENCH_VIEW_ALL=1) and of the requests of the
# status page's first visit (`dama web`), BENCH_VIEW_RUNS (default 5) times
# each: p50, p99 (the highest below 100 runs), min-max.
#
# The shape of issue 50 (1,000,000 finished, 100,000 queued, 3,000 running
# on six hosts):
#   BENCH_VIEW_CONTEXTS=1103551 BENCH_VIEW_QUEUED=100000 BENCH_VIEW_RUNNING=3000 \
#   BENCH_VIEW_HOSTS=6 BENCH_VIEW_RUNS=100 scripts/bench-view.sh
#
# Against TEST_DATABASE_URL (a superuser: the load bypasses dama's triggers
# with session_replication_role) or a throwaway PostgreSQL cluster with
# shared_buffers=3GB, which holds the whole data set (2.2 GB): the figures
# are those of the plans, not of this VM's disk. The database is dropped at
# the end unless BENCH_VIEW_KEEP=1 (with TEST_DATABASE_URL: to look at plans
# afterwards, or to measure it again with BENCH_VIEW_DB=NAME, which skips
# the load; the other BENCH_VIEW_ sizes must then be those of the load).
# BENCH_VIEW_TREE=DIR builds dama (its migrations and its `dama status`)
# from another checkout, e.g. an older commit, to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

contexts=${BENCH_VIEW_CONTEXTS:-1000000}
running=${BENCH_VIEW_RUNNING:-500}
queued=${BENCH_VIEW_QUEUED:-$((contexts / 200))}
retrying=${BENCH_VIEW_RETRYING:-$((contexts / 2000))}
hosts=${BENCH_VIEW_HOSTS:-4}
runs=${BENCH_VIEW_RUNS:-5}
explain_runs=${BENCH_VIEW_EXPLAIN_RUNS:-5}
tree=${BENCH_VIEW_TREE:-$PWD}

DAMA_PG_OPTIONS="-c shared_buffers=3GB ${DAMA_PG_OPTIONS:-}" dama_pg_use TEST_DATABASE_URL

tmp=$(mktemp -d)
db=${BENCH_VIEW_DB:-dama_bench_view_$$}
holder= web= seen=
cleanup() {
	local p
	for p in $web $seen $holder; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -z "$holder" ] || exec 3>&-
	if [ "${BENCH_VIEW_KEEP:-}" = 1 ] || [ -n "${BENCH_VIEW_DB:-}" ]; then
		echo "kept database $db" >&2
	else
		psql "$TEST_DATABASE_URL" -qX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	fi
	rm -rf "$tmp"
}
trap 'cleanup; dama_pg_stop' EXIT

# The URL of database $1 on TEST_DATABASE_URL's server, for a URL or a
# key=value connection string.
db_url() {
	case $TEST_DATABASE_URL in
	postgres://* | postgresql://*)
		printf '%s' "$TEST_DATABASE_URL" | sed -E "s#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\\1/$1#"
		;;
	*) printf '%s dbname=%s' "$TEST_DATABASE_URL" "$1" ;;
	esac
}
url=$(db_url "$db")
psql_db() { psql "$url" -qAtX -v ON_ERROR_STOP=1 "$@"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

(cd "$tree" && go build -o "$tmp/dama" ./cmd/dama)
[ -n "${BENCH_VIEW_DB:-}" ] || psql "$TEST_DATABASE_URL" -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >/dev/null
DATABASE_URL=$url "$tmp/dama" migrate 2>"$tmp/migrate.log" || { cat "$tmp/migrate.log" >&2; exit 1; }

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; PostgreSQL $(psql_db -c 'SHOW server_version'), shared_buffers $(psql_db -c 'SHOW shared_buffers'), jit $(psql_db -c 'SHOW jit')"
echo "dama: $(git -C "$tree" describe --always --dirty 2>/dev/null || echo "$tree"), migrations $(psql_db -c 'SELECT string_agg(version_id::text, $$,$$ ORDER BY version_id) FROM data_manager.schema_migrations WHERE version_id > 0 AND is_applied')"

load() {
start=$(date +%s%N)
# The rows are what dama's triggers and River would have written for the
# same history (status, attempt, initial/latest event ids, finished_at, run
# ids, River job states); the load bypasses the triggers only because firing
# them row by row would take hours. Statuses other than DONE are spread over
# the whole id range rather than bunched at the newest ids, so that no plan
# is fast by luck. Event ids follow the events' times, so a context's events
# are interleaved with those of the contexts created around it.
psql_db -o /dev/null -v contexts="$contexts" -v running="$running" -v queued="$queued" -v retrying="$retrying" -v hosts="$hosts" <<'SQL'
SET session_replication_role = replica;
SET work_mem = '256MB';
SET maintenance_work_mem = '512MB';
SET synchronous_commit = off;

-- 2654435761 is prime, so r is a permutation of 0 .. contexts-1.
CREATE TEMP TABLE plan AS
SELECT id,
       r,
       CASE WHEN r < :running THEN 'RUNNING'
            WHEN r < :running + :queued THEN 'QUEUED'
            WHEN r < :running + :queued + :retrying THEN 'RETRYING'
            WHEN r < :running + :queued + :retrying + :contexts / 100 THEN 'FAILED'
            WHEN r < :running + :queued + :retrying + :contexts / 100 + :contexts / 500 THEN 'CANCELLED'
            ELSE 'DONE' END AS status,
       -- audit: a rare kind (0.1%), for the status page's filter by kind.
       CASE WHEN id % 1000 = 7 THEN 'audit' ELSE (ARRAY['extract', 'conflation', 'load'])[1 + id % 3] END AS kind,
       CASE WHEN id % 3 = 1 THEN 'etl' ELSE 'default' END AS queue,
       now() - interval '2 days' - (:contexts - id) * interval '30 seconds' AS created_at,
       (10 + id % 230) * interval '1 minute' AS duration,
       1 + id % 3 AS progresses,
       id % 2 = 0 AS checkpoints
  FROM (SELECT id, (id * 2654435761) % :contexts AS r FROM generate_series(1, :contexts) AS id) AS g;

ALTER TABLE plan ADD COLUMN attempts integer;
UPDATE plan SET attempts = CASE status
    WHEN 'FAILED' THEN 3
    WHEN 'RETRYING' THEN 1
    WHEN 'RUNNING' THEN 1 + (id % 10 = 0)::int
    WHEN 'DONE' THEN 1 + (id % 20 = 7)::int
    ELSE 0 END;

-- Every attempt but the last ends with an ERROR after one PROGRESS; the last
-- reports PROGRESS 1..progresses and maybe a CHECKPOINT, then ends as the
-- status says (RUNNING: not yet).
INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta, error, attempt, run_id, seq, created_at)
SELECT p.id, p.kind || ':' || e.suffix, e.payload, NULL, e.suffix = 'ERROR', e.attempt, e.run_id, e.seq, e.at
  FROM plan AS p
 CROSS JOIN LATERAL (
        SELECT 'INITIAL' AS suffix, 0 AS attempt, NULL::uuid AS run_id, NULL::integer AS seq, p.created_at AS at,
               jsonb_build_object('source', 's3://landing/part-' || p.id % 1000, 'day', (p.created_at)::date) AS payload
        UNION ALL
        SELECT 'CANCELLED', 0, NULL, NULL, p.created_at + interval '10 minutes',
               '{"reason": "cancelled while not running"}'
         WHERE p.status = 'CANCELLED'
        UNION ALL
        SELECT s.suffix, a.n, md5(p.id || '/' || a.n)::uuid, k.n,
               p.created_at + interval '1 minute' + (a.n - 1) * (p.duration + interval '5 minutes') + k.n * p.duration / (s.len + 1),
               CASE s.suffix
                   WHEN 'PROGRESS' THEN jsonb_build_object('step', k.n, 'of', s.body)
                   WHEN 'CHECKPOINT' THEN jsonb_build_object('next_step', k.n)
                   WHEN 'FINAL' THEN '{"exit_code": 0}'
                   ELSE jsonb_build_object('reason', 'exit status 1', 'exit_code', 1,
                                           'log_tail', repeat('loading part ' || p.id || ': connection reset by peer; ', 6))
               END
          FROM generate_series(1, p.attempts) AS a(n)
         CROSS JOIN LATERAL (
                SELECT a.n = p.attempts AS last,
                       CASE WHEN a.n < p.attempts THEN 1 ELSE p.progresses END AS body,
                       CASE WHEN a.n < p.attempts THEN 'ERROR'
                            WHEN p.status = 'DONE' THEN 'FINAL'
                            WHEN p.status IN ('FAILED', 'RETRYING') THEN 'ERROR' END AS ending
        ) AS t
         CROSS JOIN LATERAL (
                SELECT t.body, t.body + (t.last AND p.checkpoints)::int + (t.ending IS NOT NULL)::int AS len
        ) AS l
         CROSS JOIN LATERAL generate_series(1, l.len) AS k(n)
         CROSS JOIN LATERAL (
                SELECT l.body, l.len,
                       CASE WHEN k.n <= l.body THEN 'PROGRESS'
                            WHEN k.n = l.len AND t.ending IS NOT NULL THEN t.ending
                            ELSE 'CHECKPOINT' END AS suffix
        ) AS s
  ) AS e
 ORDER BY e.at, p.id;

CREATE TEMP TABLE ends AS
SELECT etl_context_id AS id,
       min(event_id) FILTER (WHERE type LIKE '%:INITIAL') AS initial_event_id,
       max(event_id) AS latest_event_id,
       max(created_at) AS latest_at,
       min(created_at) FILTER (WHERE attempt = 1) AS first_started_at,
       max(created_at) FILTER (WHERE seq = 1) AS last_started_at,
       (array_agg(payload ORDER BY event_id DESC) FILTER (WHERE type LIKE '%:PROGRESS'))[1] AS progress,
       max(created_at) FILTER (WHERE type LIKE '%:PROGRESS') AS progress_at
  FROM data_manager.event_store
 GROUP BY etl_context_id;

INSERT INTO data_manager.etl_contexts (
       etl_context_id, parent_context_id, kind, queue, etl_status, initial_event_id, latest_event_id,
       river_job_id, idempotency_key, max_attempts, attempt, run_id, launched_by, host, pid,
       process_started_at, log_path, heartbeat_at, cancel_requested_at, created_at, started_at,
       finished_at, host_id, runner_start_ticks, command_pgid, command_start_ticks, fence_window, lock_lost_at,
       lock_mode, due_at, waiting_for, waiting_since, progress, progress_at)
SELECT p.id,
       CASE WHEN p.id % 20 = 0 THEN p.id - 1 END,
       p.kind, p.queue, p.status, x.initial_event_id, x.latest_event_id,
       p.id,
       CASE WHEN p.id % 3 = 0 THEN 'part-' || p.id END,
       3, p.attempts,
       CASE WHEN p.attempts > 0 THEN md5(p.id || '/' || p.attempts)::uuid END,
       CASE WHEN p.attempts > 0 THEN 'supervisor-' || p.id % :hosts END,
       CASE WHEN p.attempts > 0 THEN 'etl-' || p.id % :hosts END,
       CASE WHEN p.attempts > 0 THEN 1000 + p.id % 60000 END,
       CASE WHEN p.attempts > 0 THEN x.last_started_at - interval '1 second' END,
       CASE WHEN p.attempts > 0 THEN '/var/lib/dama/logs/' || p.id || '.log' END,
       CASE WHEN p.status = 'RUNNING' THEN now() WHEN p.attempts > 0 THEN x.latest_at END,
       NULL,
       p.created_at,
       x.first_started_at - interval '1 second',
       CASE WHEN p.status IN ('DONE', 'FAILED', 'CANCELLED') THEN x.latest_at END,
       CASE WHEN p.attempts > 0 THEN md5('host-' || p.id % :hosts) || '/4026531836' END,
       CASE WHEN p.attempts > 0 THEN 100000 + p.id END,
       CASE WHEN p.attempts > 0 THEN 1001 + p.id % 60000 END,
       CASE WHEN p.attempts > 0 THEN 100001 + p.id END,
       CASE WHEN p.attempts > 0 THEN interval '147 seconds' END,
       NULL,
       CASE WHEN p.attempts > 0 THEN 'host' END,
       -- A tenth of the queued are scheduled for later (within a day); a
       -- quarter of the others wait for a slot of their queue.
       CASE WHEN p.status = 'QUEUED' AND p.id % 10 = 3 THEN now() + (1 + p.id % 1440) * interval '1 minute'
            ELSE p.created_at END,
       CASE WHEN p.status = 'QUEUED' AND p.id % 10 <> 3 AND p.id % 4 = 0 THEN 'queue_full' END,
       CASE WHEN p.status = 'QUEUED' AND p.id % 10 <> 3 AND p.id % 4 = 0 THEN now() - (p.id % 60) * interval '1 minute' END,
       x.progress, x.progress_at
  FROM plan AS p
  JOIN ends AS x USING (id)
 ORDER BY p.id;

-- Each attempt, as etl_attempts_begin and etl_attempts_end record it.
INSERT INTO data_manager.etl_attempts (etl_context_id, attempt, run_id, launched_by, host, host_id, pid, lock_mode,
                                       started_at, ended_at, outcome)
SELECT e.etl_context_id, e.attempt, md5(e.etl_context_id || '/' || e.attempt)::uuid,
       'supervisor-' || e.etl_context_id % :hosts, 'etl-' || e.etl_context_id % :hosts,
       md5('host-' || e.etl_context_id % :hosts) || '/4026531836', 1000 + e.etl_context_id % 60000, 'host',
       min(e.created_at) - interval '1 second',
       CASE WHEN p.status <> 'RUNNING' OR e.attempt < p.attempts THEN max(e.created_at) END,
       CASE WHEN p.status = 'RUNNING' AND e.attempt = p.attempts THEN NULL
            WHEN p.status = 'DONE' AND e.attempt = p.attempts THEN 'DONE' ELSE 'FAILED' END
  FROM data_manager.event_store AS e
  JOIN plan AS p ON p.id = e.etl_context_id
 WHERE e.attempt > 0
 GROUP BY e.etl_context_id, e.attempt, p.status, p.attempts;

-- A serving supervisor on each host, serving every kind but the rare
-- audit, and a lost one, the last that served it.
INSERT INTO data_manager.supervisors (client_id, host, host_id, pid, release, lock_modes, queues, kinds, pod_kinds,
                                      started_at, last_seen_at)
SELECT 'supervisor-' || h, 'etl-' || h, md5('host-' || h) || '/4026531836', 500 + h, 'bench', '{host}'::text[],
       '{default,etl}'::text[], '{extract,conflation,load}'::text[], '{}'::text[], now() - interval '3 days', now()
  FROM generate_series(0, :hosts - 1) AS h
 UNION ALL
SELECT 'supervisor-audit', 'etl-audit', md5('host-audit') || '/4026531836', 499, 'bench', '{host}',
       '{default,etl}', '{audit}', '{}', now() - interval '5 days', now() - interval '2 days';
SELECT setval(pg_get_serial_sequence('data_manager.etl_contexts', 'etl_context_id'), :contexts);

-- One River job per context, inserted with the context (same id order). A
-- RUNNING task's job is snoozed while its lock is held.
INSERT INTO river_job (id, state, attempt, max_attempts, attempted_at, created_at, finalized_at,
                       scheduled_at, priority, args, attempted_by, kind, metadata, queue, tags)
SELECT c.etl_context_id,
       CASE WHEN c.etl_status = 'QUEUED' AND (c.due_at > now() OR c.waiting_for IS NOT NULL) THEN 'scheduled'
            ELSE CASE c.etl_status
                     WHEN 'DONE' THEN 'completed' WHEN 'FAILED' THEN 'discarded' WHEN 'CANCELLED' THEN 'cancelled'
                     WHEN 'RETRYING' THEN 'retryable' WHEN 'RUNNING' THEN 'scheduled' ELSE 'available' END
       END::river_job_state,
       c.attempt, c.max_attempts,
       CASE WHEN c.attempt > 0 THEN c.process_started_at END,
       c.created_at,
       c.finished_at,
       CASE WHEN c.waiting_for IS NOT NULL THEN now() + interval '1 hour'
            ELSE CASE c.etl_status WHEN 'RUNNING' THEN now() + interval '5 seconds'
                                   WHEN 'RETRYING' THEN now() + interval '10 minutes'
                                   ELSE c.due_at END
       END,
       1,
       jsonb_build_object('etl_context_id', c.etl_context_id),
       CASE WHEN c.attempt > 0 THEN ARRAY[c.launched_by] END,
       'dama_task', '{}', c.queue, '{}'
  FROM data_manager.etl_contexts AS c
 ORDER BY c.etl_context_id;
SELECT setval('river_job_id_seq', :contexts);
SQL
psql_db -c 'VACUUM ANALYZE'
echo "load: $contexts contexts, $(psql_db -c 'SELECT count(*) FROM data_manager.event_store') events in $(ms_since "$start") ms"

# The figures are only meaningful if the load is what the triggers would
# have produced; a mismatch stops the script.
psql_db <<'SQL'
DO $$
DECLARE bad bigint;
BEGIN
    WITH e AS (
        SELECT etl_context_id,
               max(event_id) AS latest,
               max(attempt) AS attempts,
               min(event_id) FILTER (WHERE type LIKE '%:INITIAL') AS initial,
               bool_and(attempt = 0 OR run_id IS NOT NULL) AS runs
          FROM data_manager.event_store
         GROUP BY etl_context_id)
    SELECT count(*) INTO bad
      FROM data_manager.etl_contexts AS c
      LEFT JOIN e USING (etl_context_id)
      LEFT JOIN data_manager.event_store AS l ON l.event_id = e.latest
      LEFT JOIN river_job AS j ON j.id = c.river_job_id
     WHERE c.latest_event_id IS DISTINCT FROM e.latest
        OR c.initial_event_id IS DISTINCT FROM e.initial
        OR c.attempt IS DISTINCT FROM e.attempts
        OR NOT e.runs
        OR c.etl_status <> CASE
               WHEN l.type = c.kind || ':FINAL' THEN 'DONE'
               WHEN l.type = c.kind || ':CANCELLED' THEN 'CANCELLED'
               WHEN l.type = c.kind || ':ERROR' AND c.attempt >= c.max_attempts THEN 'FAILED'
               WHEN l.type = c.kind || ':ERROR' THEN 'RETRYING'
               WHEN c.attempt = 0 THEN 'QUEUED'
               ELSE 'RUNNING' END
        OR (c.finished_at IS NOT NULL) <> data_manager.is_finished(c.etl_status)
        OR j.id IS NULL;
    IF bad > 0 THEN
        RAISE EXCEPTION '% contexts are not what the triggers would have written', bad;
    END IF;
    IF EXISTS (SELECT 1 FROM (SELECT created_at < lag(created_at) OVER (ORDER BY event_id) AS back
                                FROM data_manager.event_store) AS s WHERE back) THEN
        RAISE EXCEPTION 'event ids do not follow the events'' times';
    END IF;
END
$$;
SQL
}
[ -n "${BENCH_VIEW_DB:-}" ] || load
psql_db -c 'SELECT etl_status, count(*) FROM data_manager.etl_contexts GROUP BY 1 ORDER BY 1' | tr '\n' ' ' | sed 's/^/statuses: /; s/ $/\n/'

# The task processes' advisory locks, and the serving supervisors' liveness
# locks, held by one session that then sits idle, as a task process's lock
# transaction does (a session waiting in a statement would also hold a
# snapshot, which no task process does).
mkfifo "$tmp/locks"
psql "$url" -qAtX -v ON_ERROR_STOP=1 <"$tmp/locks" >/dev/null &
holder=$!
exec 3>"$tmp/locks"
echo "SET application_name = 'dama-bench-view-locks';
SELECT count(pg_advisory_lock(1684106595, hashtext(client_id))) FROM data_manager.supervisors WHERE client_id <> 'supervisor-audit';
SELECT count(pg_advisory_lock(1684106593, etl_context_id::int)) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING';" >&3
held=0
for _ in $(seq 600); do
	held=$(psql_db -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 1684106593 AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
	[ "$held" -ge "$running" ] && break
	sleep 0.1
done
[ "$held" -ge "$running" ] || { echo "the lock holder took $held of $running locks" >&2; exit 1; }

# The serving supervisors are seen every 30 s, as they write.
while psql_db -c "UPDATE data_manager.supervisors SET last_seen_at = now() WHERE client_id <> 'supervisor-audit'" >/dev/null; do
	sleep 30
done &
seen=$!

running_id=$(psql_db -c "SELECT max(etl_context_id) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING'")
done_id=$(psql_db -c "SELECT max(etl_context_id) FROM data_manager.etl_contexts WHERE etl_status = 'DONE' AND etl_context_id <= $contexts / 2")
queued_id=$(psql_db -c "SELECT max(etl_context_id) FROM data_manager.etl_contexts WHERE etl_status = 'QUEUED' AND etl_context_id <= $contexts / 2")
echo "supervisors: $(psql_db -c 'SELECT string_agg(state || $$ $$ || n, $$, $$ ORDER BY state) FROM (SELECT state, count(*) AS n FROM data_manager.dama_supervisors GROUP BY 1) AS s')"

# The statements `dama status` sends (etlcontext.Tasks), prepared as pgx
# prepares them. A tree from before migration 5 sends one statement for
# every mode, its conditions switched off by its arguments.
columns='etl_context_id, parent_context_id, kind, queue, etl_status, attempt, max_attempts,
       job_state, scheduled_at, host, pid, created_at, started_at, finished_at, heartbeat_at,
       latest_event_type, latest_event_at, progress, initial_event_locked, river_job_id,
       run_id::text, idempotency_key, cancel_requested_at, log_path,
       host_id, command_pgid, lock_lost_at'
if grep -q 'cardinality(\$2::text\[\])' "$tree/etlcontext/tasks.go"; then
	statements="PREPARE tasks AS SELECT $columns FROM data_manager.dama_task_queue
 WHERE (\$1 = 0 OR etl_context_id = \$1) AND (cardinality(\$2::text[]) = 0 OR etl_status = ANY(\$2))
 ORDER BY etl_context_id DESC LIMIT CASE WHEN \$3 > 0 THEN \$3 END;"
	newest="tasks(0, '{}', 50)" by_id="tasks($running_id, '{}', 50)"
	status() { echo "tasks(0, '{$1}', ${2:-0})"; }
else
	statements="
PREPARE newest AS SELECT $columns FROM data_manager.dama_task_queue ORDER BY etl_context_id DESC LIMIT \$1;
PREPARE by_id AS SELECT $columns FROM data_manager.dama_task_queue WHERE etl_context_id = \$1 ORDER BY etl_context_id DESC LIMIT \$2;
PREPARE by_status AS SELECT $columns FROM data_manager.dama_task_queue WHERE etl_status = \$1 ORDER BY etl_context_id DESC LIMIT \$2;
PREPARE by_status_all AS SELECT $columns FROM data_manager.dama_task_queue WHERE etl_status = \$1 ORDER BY etl_context_id DESC;
PREPARE by_statuses AS SELECT $columns FROM data_manager.dama_task_queue WHERE etl_status = ANY(\$1::text[]) ORDER BY etl_context_id DESC LIMIT \$2;"
	newest="newest(50)" by_id="by_id($running_id, 50)"
	status() {
		case $1,${2:-} in
		*,*,*) echo "by_statuses('{${1}}', $2)" ;;
		*,) echo "by_status_all('$1')" ;;
		*) echo "by_status('$1', $2)" ;;
		esac
	}
fi

if [ "$explain_runs" -gt 0 ]; then
echo
echo "EXPLAIN (ANALYZE, BUFFERS), $explain_runs runs each: median execution time (min-max), rows, the top plan node, how etl_contexts is read, buffers of the last run"
# A process running dama status executes its statement once, so with a plan
# made for its arguments (a custom plan); a long-lived client may get the
# generic plan, made without them, which the last rows show.
psql_db -v runs="$explain_runs" <<SQL
CREATE FUNCTION pg_temp.bench(label text, q text, mode text, runs integer) RETURNS text
LANGUAGE plpgsql AS \$\$
DECLARE
    plan  jsonb;
    times float8[] := '{}';
    scan  jsonb;
BEGIN
    PERFORM set_config('plan_cache_mode', mode, false);
    FOR i IN 1 .. runs LOOP
        EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || q INTO plan;
        times := times || (plan -> 0 ->> 'Execution Time')::float8;
    END LOOP;
    SELECT array_agg(t ORDER BY t) INTO times FROM unnest(times) AS t;
    scan := jsonb_path_query_first(plan, 'strict \$.**?(@."Relation Name" == "etl_contexts")');
    RETURN format('%-48s %9s ms (%s-%s)  rows %-6s %-16s %-44s hit %s read %s',
        label,
        to_char(times[(runs + 1) / 2], 'FM99990.00'),
        to_char(times[1], 'FM99990.00'), to_char(times[runs], 'FM99990.00'),
        plan -> 0 -> 'Plan' ->> 'Actual Rows',
        plan -> 0 -> 'Plan' ->> 'Node Type',
        coalesce(scan ->> 'Node Type' || coalesce(' ' || (scan ->> 'Index Name'), ''), '-'),
        plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks',
        plan -> 0 -> 'Plan' ->> 'Shared Read Blocks');
END
\$\$;
$statements
SELECT pg_temp.bench(label, q, mode, :runs)
  FROM (VALUES
    ('view: etl_context_id = id (RUNNING)', 'SELECT * FROM data_manager.dama_task_queue WHERE etl_context_id = $running_id', 'auto'),
    ('view: etl_context_id = id (DONE)', 'SELECT * FROM data_manager.dama_task_queue WHERE etl_context_id = $done_id', 'auto'),
    ('view: etl_status = RUNNING', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE etl_status = 'RUNNING'\$q\$, 'auto'),
    ('view: etl_status = QUEUED', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE etl_status = 'QUEUED'\$q\$, 'auto'),
    ('view: etl_status = FAILED', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE etl_status = 'FAILED'\$q\$, 'auto'),
    ('view: etl_status NOT IN (DONE, CANCELLED)', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE etl_status NOT IN ('DONE', 'CANCELLED')\$q\$, 'auto'),
    ('view: ORDER BY etl_context_id DESC LIMIT 50', 'SELECT * FROM data_manager.dama_task_queue ORDER BY etl_context_id DESC LIMIT 50', 'auto'),
    ('view: FAILED, ORDER BY ... DESC LIMIT 50', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE etl_status = 'FAILED' ORDER BY etl_context_id DESC LIMIT 50\$q\$, 'auto'),
    ('web: kind = load, newest 100', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE kind = 'load' ORDER BY etl_context_id DESC LIMIT 100\$q\$, 'auto'),
    ('web: kind = audit (0.1%), newest 100', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE kind = 'audit' ORDER BY etl_context_id DESC LIMIT 100\$q\$, 'auto'),
    ('web: queue = etl, FAILED, newest 100', \$q\$SELECT * FROM data_manager.dama_task_queue WHERE queue = 'etl' AND etl_status = 'FAILED' ORDER BY etl_context_id DESC LIMIT 100\$q\$, 'auto'),
    ('web: a task newest 200 events', 'SELECT * FROM (SELECT * FROM data_manager.event_store WHERE etl_context_id = $done_id ORDER BY event_id DESC LIMIT 200) AS e ORDER BY event_id', 'auto'),
    ('status (newest 50)', \$q\$EXECUTE $newest\$q\$, 'force_custom_plan'),
    ('status ID', \$q\$EXECUTE $by_id\$q\$, 'force_custom_plan'),
    ('status --status RUNNING', \$q\$EXECUTE $(status RUNNING 50)\$q\$, 'force_custom_plan'),
    ('status --status QUEUED', \$q\$EXECUTE $(status QUEUED 50)\$q\$, 'force_custom_plan'),
    ('status --status FAILED', \$q\$EXECUTE $(status FAILED 50)\$q\$, 'force_custom_plan'),
    ('status --status CANCELLED', \$q\$EXECUTE $(status CANCELLED 50)\$q\$, 'force_custom_plan'),
    ('status --status RUNNING,RETRYING', \$q\$EXECUTE $(status RUNNING,RETRYING 50)\$q\$, 'force_custom_plan'),
    ('status --status RUNNING --limit 0', \$q\$EXECUTE $(status RUNNING)\$q\$, 'force_custom_plan'),
    ('status --status FAILED --limit 0', \$q\$EXECUTE $(status FAILED)\$q\$, 'force_custom_plan'),
    ('status (newest 50), generic plan', \$q\$EXECUTE $newest\$q\$, 'force_generic_plan'),
    ('status ID, generic plan', \$q\$EXECUTE $by_id\$q\$, 'force_generic_plan'),
    ('status --status FAILED, generic plan', \$q\$EXECUTE $(status FAILED 50)\$q\$, 'force_generic_plan')
  ) AS v(label, q, mode);
SQL
fi

echo
# p50, p99 and the range of the times in ms on stdin, one a line, with the
# machine's load average (uptime) after them: the 2 CPUs are shared.
percentiles() {
	local times
	mapfile -t times < <(sort -n)
	local n=${#times[@]}
	printf '%-48s p50 %7s ms  p99 %7s ms  (%s-%s)  load %s\n' "$1" \
		"${times[$(((n + 1) / 2 - 1))]}" "${times[$(((99 * n + 99) / 100 - 1))]}" "${times[0]}" "${times[$((n - 1))]}" \
		"$(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "dama status wall time (process start to exit, output to /dev/null), $runs runs each"
status_time() {
	local label=$1 t i
	shift
	for ((i = 0; i < runs; i++)); do
		t=${EPOCHREALTIME/./}
		DATABASE_URL=$url "$tmp/dama" status "$@" >/dev/null
		t=$((${EPOCHREALTIME/./} - t))
		printf '%d.%d\n' $((t / 1000)) $((t % 1000 / 100))
	done | percentiles "$label"
}
status_time "dama status"
status_time "dama status --json" --json
status_time "dama status ID (RUNNING)" "$running_id"
status_time "dama status ID (QUEUED)" "$queued_id"
status_time "dama status ID (DONE)" "$done_id"
status_time "dama status --status QUEUED" --status QUEUED
if [ "${BENCH_VIEW_ALL:-}" = 1 ]; then
	status_time "dama status --status RUNNING" --status RUNNING
	status_time "dama status --status FAILED" --status FAILED
	status_time "dama status --status CANCELLED" --status CANCELLED
	status_time "dama status --status RUNNING,RETRYING" --status RUNNING,RETRYING
fi

# The status page: the requests of a first visit to the task list (its
# page, its configuration, the All tab's list and the chart) and to the
# Queues tab, each a new connection, as curl times it (connect to the last
# byte). The web process is started once, as an operator starts it.
cat >"$tmp/dama.yaml" <<YAML
log_dir: $tmp/logs
queues:
  default: {}
  etl: {}
kinds:
  extract: { command: ["/bin/true"] }
  conflation: { queue: etl, command: ["/bin/true"] }
  load: { command: ["/bin/true"] }
YAML
token=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
DATABASE_URL=$url DAMA_WEB_READ_TOKEN=$token "$tmp/dama" --config "$tmp/dama.yaml" web --read-only --listen 127.0.0.1:0 2>"$tmp/web.log" &
web=$!
page=
for _ in $(seq 300); do
	page=$(grep -o 'addr=http://[0-9.:]*/' "$tmp/web.log" | head -1 | cut -d= -f2) && [ -n "$page" ] && break
	kill -0 "$web" 2>/dev/null || { cat "$tmp/web.log" >&2; exit 1; }
	sleep 0.1
done
[ -n "$page" ] || { echo "dama web did not say where it listens" >&2; cat "$tmp/web.log" >&2; exit 1; }
echo
echo "status page ${page}: time of each request (curl: connect to last byte), $runs runs each"
web_time() {
	local i
	for ((i = 0; i < runs; i++)); do
		curl -sS -o /dev/null -f -H "X-Dama-Read-Token: $token" -w '%{time_total}\n' "${page%/}$1" |
			awk '{printf "%.1f\n", $1 * 1000}'
	done | percentiles "GET $1"
}
web_time /
web_time /api/config
web_time '/api/tasks?'
web_time '/api/finished?per=hour'
web_time /queues
web_time /api/queues
# The first visit as a whole, its four requests one after another (a
# browser sends the list's and the chart's at once).
for ((i = 0; i < runs; i++)); do
	curl -sS -o /dev/null -f -H "X-Dama-Read-Token: $token" -w '%{time_total}\n' \
		"${page}" "${page}api/config" "${page}api/tasks?" "${page}api/finished?per=hour" |
		awk '{t += $1} END {printf "%.1f\n", t * 1000}'
done | percentiles "first visit (/, config, tasks, finished)"
