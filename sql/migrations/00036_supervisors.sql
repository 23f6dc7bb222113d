-- Who serves: each supervisor records itself as it starts (host, pid,
-- release, what it serves) and how long it was seen; dama_supervisors
-- answers "is anyone serving kind hello" in psql, `dama supervisors` and
-- the page's Queues tab, and a waiting task's reason says when nobody does.
--
-- Whether a supervisor serves is not a heartbeat's age: it is its
-- liveness lock (supervisor/liveness.go: pg_advisory_lock(1684106595,
-- hashtext(client_id)), held by its liveness connection for as long as
-- it lives), which the server releases the moment that session ends, or
-- within 25 s of its host going silent (server-side keepalives). So a
-- supervisor killed with SIGKILL stops serving at once in this view (LOST,
-- or STOPPED when it stopped cleanly). last_seen_at, written every 30 s,
-- says since when one is gone, and that one whose session lives on is
-- stuck (UNRESPONSIVE, after 90 s). Each supervisor, as it writes its
-- row, removes those not seen for a day.

-- +goose Up
CREATE TABLE data_manager.supervisors (
    client_id    text PRIMARY KEY,
    host         text NOT NULL,
    host_id      text NOT NULL,
    pid          integer NOT NULL,
    release      text NOT NULL,
    lock_modes   text[] NOT NULL,
    queues       text[] NOT NULL,
    kinds        text[] NOT NULL,
    -- Its kinds whose tasks run in pods of their own, on no host of its.
    pod_kinds    text[] NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz
);

CREATE VIEW data_manager.dama_supervisors AS
-- Any login may take an advisory lock: only one that may write this
-- table, as a supervisor's may, counts (a reader or a task's login holding
-- a dead supervisor's lock would show it SERVING).
WITH serving AS MATERIALIZED (
    SELECT l.objid, a.application_name, a.backend_start
      FROM pg_catalog.pg_locks AS l
      JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.classid = 1684106595 AND l.objsubid = 2 AND l.granted
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
       AND has_table_privilege(a.usesysid, 'data_manager.supervisors', 'INSERT')
),
-- Counted once, not once per supervisor: the page reads this every second.
running AS MATERIALIZED (
    SELECT c.queue, c.host_id, c.kind, count(*) AS n
      FROM data_manager.etl_contexts AS c
     WHERE c.etl_status = 'RUNNING'
     GROUP BY c.queue, c.host_id, c.kind
)
-- A lock without a row is a supervisor of a release before this view's,
-- which records nothing: it serves, what is unknown (NULL), its host the
-- start of its client id, which names its liveness connection.
SELECT CASE WHEN g.objid IS NOT NULL AND (s.client_id IS NULL OR s.last_seen_at > now() - interval '90 seconds') THEN 'SERVING'
            -- Its session lives on, but it was not seen for three
            -- sightings: stopped (SIGSTOP), or stuck.
            WHEN g.objid IS NOT NULL THEN 'UNRESPONSIVE'
            WHEN s.stopped_at IS NOT NULL THEN 'STOPPED'
            ELSE 'LOST' END AS state,
       coalesce(s.host, regexp_replace(substr(g.application_name, 26), '_[0-9]{4}_[0-9]{2}_[0-9]{2}T.*$', ''), 'unknown') AS host,
       s.pid,
       s.release,
       s.lock_modes,
       s.queues,
       s.kinds,
       s.pod_kinds,
       -- The tasks it watches: running on its host in its queues, or in
       -- pods (so two supervisors of one host, or replicas with the same
       -- pod kinds, count the same tasks); NULL once its session ended.
       CASE WHEN g.objid IS NOT NULL AND s.client_id IS NOT NULL THEN
           (SELECT coalesce(sum(r.n), 0) FROM running AS r
             WHERE r.queue = ANY (s.queues) AND (r.host_id = s.host_id OR r.kind = ANY (s.pod_kinds)))
       END AS running,
       coalesce(s.started_at, g.backend_start) AS started_at,
       coalesce(s.last_seen_at, now()) AS last_seen_at,
       s.stopped_at,
       coalesce(s.client_id, substr(g.application_name, 26), '') AS client_id,
       s.host_id
  FROM data_manager.supervisors AS s
  FULL JOIN serving AS g ON g.objid = hashtext(s.client_id)::oid;

-- Its first readers plan against statistics, not an empty table's guess.
ANALYZE data_manager.supervisors;

-- +goose Down
DROP VIEW data_manager.dama_supervisors;
DROP TABLE data_manager.supervisors;
