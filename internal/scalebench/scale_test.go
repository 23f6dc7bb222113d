package scalebench_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
)

// TestMain builds dama only when a benchmark or TestHostsCut
// (DAMA_TEST_HOSTS) runs: `go test ./...` runs this package's quick tests
// and nothing else.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); (f == nil || f.Value.String() == "") && os.Getenv("DAMA_TEST_HOSTS") == "" {
		os.Exit(m.Run())
	}
	testenv.Main(m)
}

// River's fetch settings in a supervisor: supervisor.Options' defaults
// (defaultFetchCooldown and defaultFetchPollInterval in
// supervisor/supervisor.go). The plain-River floor runs with the same.
const (
	fetchCooldown     = 10 * time.Millisecond
	fetchPollInterval = 250 * time.Millisecond
)

// The kinds and queues of the benchmark's configuration.
const (
	quietKind = "quiet" // the N tasks that run quietly
	probeKind = "probe" // the short tasks whose start is timed
)

// probeRun is how long a probe task's command runs: long enough for its lock
// to be checked once it is seen started, short enough not to linger.
const probeRun = 200 * time.Millisecond

// BenchmarkScale measures, for each size N and lock mode, one supervisor
// (the built `dama supervisor`, shipped defaults but max_running) with N
// tasks that run quietly, on a PostgreSQL server of its own:
//
//   - transactions/s in the database, and row updates/s of river_job and
//     data_manager.etl_contexts, over a steady window;
//   - the dead row versions VACUUM cannot remove after the window, in
//     river_job, etl_contexts and a table the benchmark updates 10 times a
//     second during the window;
//   - ERROR lines in the server log during the window;
//   - CPU and memory of the supervisor, the task processes and the server;
//     the server connections each holds;
//   - Submit → lock latency of short tasks with 0 and with N running, against
//     the floors of plain River (insert → Work) and of a bare fork/exec +
//     connect + advisory lock, measured on the same server;
//   - after a SIGKILL of the supervisor and the start of another, once it
//     adopted the tasks, how long until all N, exiting at once, are DONE
//     with their River job completed.
//
// Run it with scripts/bench.sh scale; it is never part of go test ./...
func BenchmarkScale(b *testing.B) {
	p, err := loadParams()
	if err != nil {
		b.Fatal(err)
	}
	bins := buildHelpers(b)
	fmt.Printf("scale benchmark: sizes %v, modes %v, window %s after a %s settle, %d probes, %d floor samples, adoption within %s\n",
		p.sizes, p.modes, p.window, p.settle, p.probes, p.floorSamples, p.adoptWait)
	var results []*result
	for _, mode := range p.modes {
		for _, n := range p.sizes {
			r := &result{mode: mode, n: n, m: map[string]float64{}}
			results = append(results, r)
			b.Run(fmt.Sprintf("%s-%d", mode, n), func(b *testing.B) {
				runScale(b, p, bins, r)
			})
		}
	}
	printSummary(os.Stdout, p, results)
}

// lockQuery counts the tasks of a kind that hold their lock (RUNNING, their
// task process recorded, and its advisory lock granted in pg_locks), the
// finished ones, and those past their first attempt.
const lockQuery = `
SELECT count(*) FILTER (WHERE c.etl_status = 'RUNNING' AND c.pid IS NOT NULL AND l.granted),
       count(*) FILTER (WHERE c.etl_status NOT IN ('QUEUED', 'RUNNING')),
       count(*) FILTER (WHERE c.attempt > 1)
  FROM data_manager.etl_contexts AS c
  LEFT JOIN pg_locks AS l
    ON l.locktype = 'advisory' AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid::bigint = $2 AND l.objsubid = 2 AND l.objid::bigint = c.etl_context_id
 WHERE c.kind = $1`

func runScale(b *testing.B, p params, bins helpers, r *result) {
	ctx := context.Background()
	// Host mode on a server left at the default: its task processes hold
	// no connection of their own.
	maxConnections := max(200, 2*r.n+300)
	if r.mode == config.LockModeHost {
		maxConnections = 100
	}
	srv := testenv.NewServerWith(b, fmt.Sprintf("max_connections = %d", maxConnections))
	env := testenv.NewOn(b, srv)
	mon := connect(b, env.URL, "dama-scalebench-monitor", nil)
	var version, maxConns string
	if err := mon.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('max_connections')`).Scan(&version, &maxConns); err != nil {
		b.Fatal(err)
	}
	r.say("PostgreSQL %s on 127.0.0.1:%d, max_connections %s", version, srv.Port(), maxConns)

	// The floors, on a database of their own on the same server, idle.
	base := testenv.NewOn(b, srv)
	riverLat := riverFloor(b, base.URL, p.floorSamples)
	r.m["river_p50"], r.m["river_p99"] = scalebench.Percentile(riverLat, 0.5), scalebench.Percentile(riverLat, 0.99)
	r.say("plain River insert → Work (FetchCooldown %s, FetchPollInterval %s): n=%d p50 %.1f ms, p99 %.1f ms",
		fetchCooldown, fetchPollInterval, len(riverLat), r.m["river_p50"], r.m["river_p99"])
	forkLat := forkFloor(b, base, bins.floor, p.floorSamples)
	r.m["fork_p50"], r.m["fork_p99"] = scalebench.Percentile(forkLat, 0.5), scalebench.Percentile(forkLat, 0.99)
	r.say("fork/exec + connect + pg_try_advisory_lock: n=%d p50 %.1f ms, p99 %.1f ms", len(forkLat), r.m["fork_p50"], r.m["fork_p99"])
	base.Pool.Close()

	// A table the benchmark updates during the window: what VACUUM leaves
	// in it tells how far back the running tasks hold the cluster's horizon.
	if _, err := mon.Exec(ctx, `
		CREATE TABLE scalebench_churn (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0) WITH (autovacuum_enabled = false);
		INSERT INTO scalebench_churn (id) SELECT generate_series(1, 5)`); err != nil {
		b.Fatal(err)
	}

	release := filepath.Join(env.Dir, "release")
	// The shipped defaults, but max_running: every quiet task fits.
	cfgPath := env.WriteConfig(strings.NewReplacer(
		"MODE", string(r.mode), "QUIET", quietKind, "PROBE", probeKind,
		"MAXRUNNING", strconv.Itoa(max(600, r.n+100)), "BIN", strconv.Quote(bins.quiet),
		"RELEASE", strconv.Quote(release), "RUNFOR", strconv.Quote(probeRun.String()),
	).Replace(`
lock_mode: MODE
log_dir: {{dir}}/logs
queues:
  QUIET: { max_running: MAXRUNNING }
  PROBE: { max_running: 50 }
kinds:
  QUIET:
    queue: QUIET
    command: [BIN, RELEASE]
  PROBE:
    queue: PROBE
    command: [BIN, "-for", RUNFOR]
`))
	cfg, err := config.Load(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	sup := env.Start(cfgPath, "supervisor")
	waitStarted(b, sup)

	pool := newPool(b, env.URL, "dama-scalebench-submit")
	client, err := dama.NewClient(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	probeConn := connect(b, env.URL, "dama-scalebench-probe", nil)

	// Submit → lock with nothing else running.
	probe(b, client, probeConn, p.probes).say(r, "lock0", "0 running")

	// N quiet tasks.
	submitted := time.Now()
	for range r.n {
		if _, _, err := client.Submit(ctx, dama.SubmitParams{Kind: quietKind}); err != nil {
			b.Fatal(err)
		}
	}
	waitLocked(b, r, mon, submitted, p.startDeadline)
	r.m["start_all_s"] = time.Since(submitted).Seconds()
	r.say("all %d hold their lock %.1f s after the first submit", r.n, r.m["start_all_s"])

	churn := connect(b, env.URL, "dama-scalebench-churn", nil)
	if _, err := churn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	// An idle backend reports its transactions to pg_stat_database up to
	// 10s late, by a timer of the server's that no query can hurry for
	// another session: those of the starts must not fall in the window.
	time.Sleep(p.settle) // deliberately: the server's statistics delay
	measureWindow(b, p, r, srv, env, sup, mon, churn)

	probe(b, client, probeConn, p.probes).say(r, "lockN", fmt.Sprintf("%d running", r.n))
	r.m["ratio_lock"] = r.m["lockN_p50"] / r.m["lock0_p50"]
	r.m["ratio_floor0"] = r.m["lock0_p50"] / (r.m["river_p50"] + r.m["fork_p50"])
	r.m["ratio_floor"] = r.m["lockN_p50"] / (r.m["river_p50"] + r.m["fork_p50"])

	restartAndSettle(b, p, r, env, sup, cfgPath, mon, bins, release)
}

// connect opens a connection named for pg_stat_activity, closed when b ends.
func connect(b testing.TB, url, name string, onNotice pgconn.NoticeHandler) *pgx.Conn {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = name
	cfg.OnNotice = onNotice
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func newPool(b testing.TB, url, name string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
