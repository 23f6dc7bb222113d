package scalebench_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// TestMain builds dama only when a benchmark runs: `go test ./...` runs
// this package's quick tests and nothing else.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
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

// params are the benchmark's settings, from the environment (scripts/bench.sh
// scale sets the first two from its arguments).
type params struct {
	sizes []int             // DAMA_BENCH_SIZES: "50,500" (0: the idle cost)
	modes []config.LockMode // DAMA_BENCH_MODES: "row,advisory"
	// window is how long the steady state is measured (DAMA_BENCH_WINDOW,
	// 60s), after settle (DAMA_BENCH_SETTLE, 15s: at least 11s, so that
	// the bench's own connections' statistics, which an idle backend
	// reports within 10s, are in before the window opens).
	window, settle time.Duration
	// probes is how many submit→lock samples are taken at 0 and at N
	// running (DAMA_BENCH_PROBES, 40); floorSamples, of each floor
	// (DAMA_BENCH_FLOOR_SAMPLES, 100).
	probes, floorSamples int
	// adoptWait is how long the new supervisor is given to adopt the tasks
	// after the old one was SIGKILLed (DAMA_BENCH_ADOPT_WAIT): by default the
	// rescue grace of a dead supervisor's steps, max(2 x poll_interval, 10s),
	// plus two poll intervals (docs/architecture.md: a dead supervisor's step is rescued
	// within that) plus 5s.
	adoptWait time.Duration
	// startDeadline bounds the wait for all N to hold their lock
	// (DAMA_BENCH_START_DEADLINE, 10m).
	startDeadline time.Duration
}

func loadParams() (params, error) {
	poll := time.Duration(config.DefaultPollInterval)
	p := params{
		window: 60 * time.Second, settle: 15 * time.Second,
		probes: 40, floorSamples: 100,
		adoptWait:     max(2*poll, 10*time.Second) + 2*poll + 5*time.Second,
		startDeadline: 10 * time.Minute,
	}
	for _, s := range strings.Split(envOr("DAMA_BENCH_SIZES", "50,500"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return p, fmt.Errorf("DAMA_BENCH_SIZES: %q is not a number of tasks", s)
		}
		p.sizes = append(p.sizes, n)
	}
	for _, s := range strings.Split(envOr("DAMA_BENCH_MODES", "row,advisory"), ",") {
		m := config.LockMode(strings.TrimSpace(s))
		if !m.Valid() {
			return p, fmt.Errorf("DAMA_BENCH_MODES: %q is not a lock mode (row, advisory, host)", s)
		}
		p.modes = append(p.modes, m)
	}
	for name, d := range map[string]*time.Duration{
		"DAMA_BENCH_WINDOW": &p.window, "DAMA_BENCH_SETTLE": &p.settle,
		"DAMA_BENCH_ADOPT_WAIT": &p.adoptWait, "DAMA_BENCH_START_DEADLINE": &p.startDeadline,
	} {
		if v := os.Getenv(name); v != "" {
			parsed, err := time.ParseDuration(v)
			if err != nil || parsed <= 0 {
				return p, fmt.Errorf("%s: %q is not a positive duration", name, v)
			}
			*d = parsed
		}
	}
	for name, n := range map[string]*int{"DAMA_BENCH_PROBES": &p.probes, "DAMA_BENCH_FLOOR_SAMPLES": &p.floorSamples} {
		if v := os.Getenv(name); v != "" {
			parsed, err := strconv.Atoi(v)
			if err != nil || parsed < 1 {
				return p, fmt.Errorf("%s: %q is not a positive number", name, v)
			}
			*n = parsed
		}
	}
	return p, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// helpers are the benchmark's own binaries.
type helpers struct{ quiet, floor string }

func buildHelpers(b *testing.B) helpers {
	dir := b.TempDir()
	h := helpers{quiet: filepath.Join(dir, "quiet"), floor: filepath.Join(dir, "floor")}
	for _, bin := range []string{h.quiet, h.floor} {
		cmd := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(bin))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("build %s: %v\n%s", filepath.Base(bin), err, out)
		}
	}
	return h
}

// result holds the figures of one run (one lock mode, one size): m maps a
// metric's key (see rows) to its value; a missing one was not measured.
type result struct {
	mode config.LockMode
	n    int
	m    map[string]float64
}

func (r *result) name() string { return fmt.Sprintf("%s/%d", r.mode, r.n) }

func (r *result) get(key string) float64 {
	if v, ok := r.m[key]; ok {
		return v
	}
	return math.NaN()
}

// say prints one line of the run's details as it is measured.
func (r *result) say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", r.name(), fmt.Sprintf(format, args...))
}

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
	fmt.Printf("scale benchmark: sizes %v, modes %v, window %s after a %s settle, %d probes, %d floor samples, adopt wait %s\n",
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
	client, err := supervisor.NewClient(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	probeConn := connect(b, env.URL, "dama-scalebench-probe", nil)

	// Submit → lock with nothing else running.
	probe(b, client, probeConn, p.probes).say(r, "lock0", "0 running")

	// N quiet tasks.
	submitted := time.Now()
	for range r.n {
		if _, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: quietKind}); err != nil {
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
	time.Sleep(p.settle)
	measureWindow(b, p, r, srv, env, sup, mon, churn)

	probe(b, client, probeConn, p.probes).say(r, "lockN", fmt.Sprintf("%d running", r.n))
	r.m["ratio_lock"] = r.m["lockN_p50"] / r.m["lock0_p50"]
	r.m["ratio_floor0"] = r.m["lock0_p50"] / (r.m["river_p50"] + r.m["fork_p50"])
	r.m["ratio_floor"] = r.m["lockN_p50"] / (r.m["river_p50"] + r.m["fork_p50"])

	restartAndSettle(b, p, r, env, sup, cfgPath, mon, bins, release)
}

// measureWindow measures the steady state over p.window.
func measureWindow(b *testing.B, p params, r *result, srv *testenv.Server, env *testenv.Env, sup *testenv.Proc, mon, churn *pgx.Conn) {
	ctx := context.Background()
	supPID := sup.Cmd.Process.Pid
	runners := runnerPIDs(b, mon)
	var backend int
	if err := mon.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	st, err := scalebench.ReadProcStat(backend)
	if err != nil {
		b.Fatalf("read the server's processes: %v", err)
	}
	server := append(scalebench.Children(st.PPID), st.PPID)

	// The bench's own transactions in the database during the window are
	// counted and taken off: the statistics flush of the monitor, then its
	// snapshot and the flush that reports it at once (2), the churn
	// updates and the churn connection's final flush (1).
	if _, err := mon.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	before := dbStats(b, mon)
	if _, err := mon.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	own := int64(2)
	t0 := time.Now()
	cpuSup0, cpuRun0, cpuSrv0 := scalebench.CPUTicks([]int{supPID}), scalebench.CPUTicks(runners), scalebench.CPUTicks(server)
	logStart := len(srv.Log())

	stop := make(chan struct{})
	var churned int64
	var churnErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := churn.Exec(ctx, `UPDATE scalebench_churn SET n = n + 1 WHERE id = $1`, i%5+1); err != nil {
				churnErr = err
				return
			}
			churned++
		}
	})
	time.Sleep(p.window)
	close(stop)
	wg.Wait()
	if churnErr != nil {
		b.Fatalf("churn: %v", churnErr)
	}
	if _, err := churn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	own += churned + 1
	after := dbStats(b, mon)
	window := time.Since(t0)
	cpuSup1, cpuRun1, cpuSrv1 := scalebench.CPUTicks([]int{supPID}), scalebench.CPUTicks(runners), scalebench.CPUTicks(server)
	logText := srv.Log()
	secs := window.Seconds()

	tx := after.xacts - before.xacts - own
	r.m["tx_s"] = float64(tx) / secs
	r.m["river_upd_s"] = float64(after.riverUpd-before.riverUpd) / secs
	r.m["ctx_upd_s"] = float64(after.ctxUpd-before.ctxUpd) / secs
	r.say("window %.1f s: %d transactions (%.1f/s; the bench's own %d taken off), river_job %.1f updates/s, etl_contexts %.1f updates/s",
		secs, tx, r.m["tx_s"], own, r.m["river_upd_s"], r.m["ctx_upd_s"])

	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / secs }
	r.m["sup_cpu"] = pct(scalebench.CPUDelta(cpuSup0, cpuSup1))
	r.m["runners_cpu"] = pct(scalebench.CPUDelta(cpuRun0, cpuRun1))
	r.m["server_cpu"] = pct(scalebench.CPUDelta(cpuSrv0, cpuSrv1))
	if rss, err := scalebench.RSS(supPID); err == nil {
		r.m["sup_rss"] = float64(rss) / (1 << 20)
	}
	var rss []float64
	for _, pid := range runners {
		if n, err := scalebench.RSS(pid); err == nil {
			rss = append(rss, float64(n)/(1<<20))
		}
	}
	if len(rss) > 0 {
		r.m["runner_rss_med"], r.m["runner_rss_max"] = scalebench.Median(rss), slices.Max(rss)
	}
	var pss []float64
	for _, pid := range runners {
		if n, err := scalebench.PSS(pid); err == nil {
			pss = append(pss, float64(n)/(1<<20))
		}
	}
	if len(pss) > 0 {
		r.m["runner_pss_med"] = scalebench.Median(pss)
	}
	r.say("CPU (%% of one core): supervisor %.1f, %d task processes together %.1f, server %.1f; RSS: supervisor %.1f MB, task process median %.1f MB, max %.1f MB",
		r.m["sup_cpu"], len(runners), r.m["runners_cpu"], r.m["server_cpu"], r.get("sup_rss"), r.get("runner_rss_med"), r.get("runner_rss_max"))

	errs, msgs := scalebench.ErrorLines(logText[min(logStart, len(logText)):])
	r.m["errors"] = float64(errs)
	r.say("server log: %d ERROR lines in the window", errs)
	for i, m := range msgs {
		if i == 5 {
			r.say("  ... and %d other messages", len(msgs)-i)
			break
		}
		r.say("  %6d  %s", m.Count, m.Message)
	}

	// Connections, at the end of the window: every client backend of the
	// server, and which process holds each (by its TCP socket).
	var total int
	if err := mon.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&total); err != nil {
		b.Fatal(err)
	}
	self := os.Getpid()
	keepers := keeperPIDs(filepath.Join(env.Dir, "logs"))
	// The supervisor's spare task process: its child that runs no task.
	var spares []int
	for _, pid := range scalebench.Children(supPID) {
		if !slices.Contains(runners, pid) {
			spares = append(spares, pid)
		}
	}
	conns, err := scalebench.ConnectionsTo(srv.Port(), slices.Concat([]int{self, supPID}, runners, keepers, spares))
	if err != nil {
		b.Fatal(err)
	}
	spareConns := 0
	for _, pid := range spares {
		spareConns += conns[pid]
	}
	tasks := 0
	for _, pid := range append(slices.Clone(runners), keepers...) {
		tasks += conns[pid]
	}
	r.m["conns"] = float64(total - conns[self])
	r.m["conns_sup"] = float64(conns[supPID])
	if r.n > 0 {
		r.m["conns_task"] = float64(tasks) / float64(r.n)
	}
	r.say("server connections: %d client backends: supervisor %d, its spare task process %d, task processes and lock keeper (%d) %d (%.2f per task), the bench's own %d, other %d",
		total, conns[supPID], spareConns, len(keepers), tasks, r.m["conns_task"], conns[self], total-conns[self]-conns[supPID]-spareConns-tasks)

	vacuum(b, r, env.URL)
}

type stats struct{ xacts, riverUpd, ctxUpd int64 }

// dbStats reads the database's transaction count and the two tables' row
// updates from a fresh statistics snapshot.
func dbStats(b *testing.B, mon *pgx.Conn) stats {
	ctx := context.Background()
	var s stats
	err := pgx.BeginFunc(ctx, mon, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()),
			       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'river_job'::regclass),
			       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'data_manager.etl_contexts'::regclass)`).
			Scan(&s.xacts, &s.riverUpd, &s.ctxUpd)
	})
	if err != nil {
		b.Fatalf("read statistics: %v", err)
	}
	return s
}

// vacuum runs VACUUM (VERBOSE) on river_job, etl_contexts and the churn
// table, and records the dead row versions each could not remove.
func vacuum(b *testing.B, r *result, url string) {
	ctx := context.Background()
	var mu sync.Mutex
	var notices []string
	conn := connect(b, url, "dama-scalebench-vacuum", func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message+"\n"+n.Detail)
		mu.Unlock()
	})
	defer conn.Close(ctx)
	for _, t := range []struct{ key, table string }{
		{"dead_river", "river_job"}, {"dead_ctx", "data_manager.etl_contexts"}, {"dead_churn", "scalebench_churn"},
	} {
		mu.Lock()
		notices = nil
		mu.Unlock()
		if _, err := conn.Exec(ctx, `VACUUM (VERBOSE, PROCESS_TOAST false) `+t.table); err != nil {
			b.Fatalf("vacuum %s: %v", t.table, err)
		}
		mu.Lock()
		for _, n := range notices {
			if strings.Contains(n, "pg_toast") {
				continue
			}
			if dead, ok := scalebench.DeadNotRemovable(n); ok {
				r.m[t.key] += float64(dead)
			}
		}
		mu.Unlock()
		if _, ok := r.m[t.key]; !ok {
			b.Errorf("VACUUM VERBOSE %s: no count of dead row versions not yet removable in %q", t.table, notices)
		}
	}
	r.say("dead row versions VACUUM cannot remove: river_job %.0f, etl_contexts %.0f, churn table %.0f",
		r.get("dead_river"), r.get("dead_ctx"), r.get("dead_churn"))
}

// restartAndSettle SIGKILLs the supervisor, starts another, lets it adopt
// the tasks, then makes every quiet task's command exit at once and times
// how long until all are DONE with their River job completed.
func restartAndSettle(b *testing.B, p params, r *result, env *testenv.Env, sup *testenv.Proc, cfgPath string, mon *pgx.Conn, bins helpers, release string) {
	ctx := context.Background()
	sup.Kill(b, syscall.SIGKILL)
	_ = sup.Wait()
	sup2 := env.Start(cfgPath, "supervisor")
	clientID := waitStarted(b, sup2)
	time.Sleep(p.adoptWait)
	var locked, finished, retried int
	if err := mon.QueryRow(ctx, lockQuery, quietKind, protocol.LockNamespace).Scan(&locked, &finished, &retried); err != nil {
		b.Fatal(err)
	}
	if locked != r.n {
		b.Fatalf("after the restart, %d of %d tasks hold their lock (%d finished, %d retried)", locked, r.n, finished, retried)
	}
	var states string
	if err := mon.QueryRow(ctx, `
		SELECT coalesce(string_agg(state || ' ' || n, ', ' ORDER BY state), 'none') FROM (
		  SELECT j.state::text AS state, count(*) AS n
		    FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		   WHERE c.kind = $1 GROUP BY 1) AS s`, quietKind).Scan(&states); err != nil {
		b.Fatal(err)
	}
	var adopted int
	if err := mon.QueryRow(ctx, `
		SELECT count(*) FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.kind = $1 AND j.attempted_by[array_upper(j.attempted_by, 1)] = $2`, quietKind, clientID).Scan(&adopted); err != nil {
		b.Fatal(err)
	}
	r.say("SIGKILLed the supervisor; %s after the new one started, all %d still hold their lock; their jobs: %s; last worked by the new supervisor: %d",
		p.adoptWait, r.n, states, adopted)

	cmds := scalebench.ProcessesOf(bins.quiet, release)
	var releasedAt time.Time
	if err := mon.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&releasedAt); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	signalled := 0
	for _, pid := range cmds {
		if syscall.Kill(pid, syscall.SIGUSR1) == nil {
			signalled++
		}
	}
	// The fallback for a command not found (it looks once a second).
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if signalled != r.n {
		r.say("WARNING: signalled %d commands of %d; the others exit within a second of the release file", signalled, r.n)
	}
	deadline := t0.Add(10 * time.Minute)
	lastReport := t0
	for {
		var settled, done int
		if err := mon.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE c.etl_status = 'DONE' AND j.state = 'completed'), count(*) FILTER (WHERE c.etl_status = 'DONE')
			  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.kind = $1`, quietKind).Scan(&settled, &done); err != nil {
			b.Fatal(err)
		}
		if settled == r.n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d tasks settled (%d DONE) 10 minutes after their commands exited", settled, r.n, done)
		}
		if time.Since(lastReport) > 10*time.Second {
			fmt.Fprintf(os.Stderr, "[%s] settling: %d of %d DONE, %d with their job completed\n", r.name(), done, r.n, settled)
			lastReport = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.m["settle_s"] = time.Since(t0).Seconds()
	rows, err := mon.Query(ctx, `
		SELECT extract(epoch FROM j.finalized_at - $2::timestamptz)::float8
		  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.kind = $1`, quietKind, releasedAt)
	if err != nil {
		b.Fatal(err)
	}
	each, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		b.Fatal(err)
	}
	r.m["settle_p50_s"] = scalebench.Median(each)
	r.say("commands exited at once: all %d DONE with their job completed after %.2f s (a task's p50 %.2f s)", r.n, r.m["settle_s"], r.m["settle_p50_s"])
	if retried > 0 {
		r.say("WARNING: %d tasks needed more than one attempt", retried)
	}
	r.m["complete"] = 1
}

// waitStarted waits for the supervisor's "supervisor started" log line and
// returns its River client id.
func waitStarted(b *testing.B, sup *testenv.Proc) string {
	re := regexp.MustCompile(`msg="supervisor started".* client_id=("[^"]*"|\S+)`)
	var id string
	testenv.Eventually(b, time.Minute, "the supervisor to start", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		if m := re.FindSubmatch(log); m != nil {
			id = strings.Trim(string(m[1]), `"`)
			return true, nil
		}
		return false, err
	})
	return id
}

// waitLocked waits until all r.n quiet tasks hold their lock.
func waitLocked(b *testing.B, r *result, mon *pgx.Conn, since time.Time, timeout time.Duration) {
	ctx := context.Background()
	deadline := since.Add(timeout)
	lastReport := time.Now()
	for {
		var locked, finished, retried int
		if err := mon.QueryRow(ctx, lockQuery, quietKind, protocol.LockNamespace).Scan(&locked, &finished, &retried); err != nil {
			b.Fatal(err)
		}
		if finished > 0 || retried > 0 {
			b.Fatalf("%d quiet tasks finished and %d were retried while starting", finished, retried)
		}
		if locked == r.n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d tasks hold their lock after %s", locked, r.n, timeout)
		}
		if time.Since(lastReport) >= 10*time.Second {
			fmt.Fprintf(os.Stderr, "[%s] %d of %d hold their lock after %.0f s\n", r.name(), locked, r.n, time.Since(since).Seconds())
			lastReport = time.Now()
		}
		time.Sleep(time.Second)
	}
}

// runnerPIDs lists the task processes of the quiet tasks, as they recorded
// themselves.
func runnerPIDs(b *testing.B, mon *pgx.Conn) []int {
	rows, err := mon.Query(context.Background(), `
		SELECT pid FROM data_manager.etl_contexts WHERE kind = $1 AND etl_status = 'RUNNING' AND pid IS NOT NULL`, quietKind)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		b.Fatal(err)
	}
	return pids
}

// probes are the submit→lock samples of one probe run.
type probes struct {
	// ds are the samples: from Submit returning to the task process
	// having recorded its pid.
	ds []time.Duration
	// unseen counts the tasks whose lock was not in pg_locks once their
	// pid was recorded.
	unseen int
	// fetch, step and runner split each sample, in milliseconds, by the
	// server's clock: River's insert to its fetch of the job
	// (attempted_at), the fetch to the supervisor's step beginning the
	// attempt (started_at), and that to the task process recording itself
	// (heartbeat_at, the start of its transaction).
	fetch, step, runner []float64
}

// say prints the samples' percentiles and the median of each part.
func (p probes) say(r *result, key, what string) {
	r.m[key+"_p50"], r.m[key+"_p99"] = scalebench.Percentile(p.ds, 0.5), scalebench.Percentile(p.ds, 0.99)
	r.say("submit → lock at %s: n=%d p50 %.1f ms, p99 %.1f ms (medians: River fetch %.1f ms, to the step %.1f ms, to the task process recorded %.1f ms)%s",
		what, len(p.ds), r.m[key+"_p50"], r.m[key+"_p99"],
		scalebench.Median(p.fetch), scalebench.Median(p.step), scalebench.Median(p.runner), unseenNote(p.unseen))
}

// probe submits n short tasks one after another (after two not counted),
// each once the previous one is DONE with its job completed, and times
// each from Submit returning to its task process having recorded its pid,
// which it does once it holds its lock; the lock is then looked for in
// pg_locks. Only conn polls, every millisecond, and only while a probe
// starts.
func probe(b *testing.B, client *supervisor.Client, conn *pgx.Conn, n int) (st probes) {
	ctx := context.Background()
	const warmup = 2
	for i := range n + warmup {
		id, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: probeKind})
		if err != nil {
			b.Fatal(err)
		}
		submitted := time.Now()
		deadline := submitted.Add(30 * time.Second)
		for {
			var started bool
			if err := conn.QueryRow(ctx, `SELECT pid IS NOT NULL FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&started); err != nil {
				b.Fatal(err)
			}
			if started {
				if i >= warmup {
					st.ds = append(st.ds, time.Since(submitted))
				}
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("probe task %d did not start in 30s", id)
			}
			time.Sleep(time.Millisecond)
		}
		var held bool
		if err := conn.QueryRow(ctx, `
			SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted
			   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			   AND classid::bigint = $2 AND objsubid = 2 AND objid::bigint = $1)`, id, protocol.LockNamespace).Scan(&held); err != nil {
			b.Fatal(err)
		}
		if !held {
			st.unseen++
		}
		if i >= warmup {
			var fetch, step, runner float64
			if err := conn.QueryRow(ctx, `
				SELECT extract(epoch FROM j.attempted_at - j.created_at) * 1000,
				       extract(epoch FROM c.started_at - j.attempted_at) * 1000,
				       extract(epoch FROM c.heartbeat_at - c.started_at) * 1000
				  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
				 WHERE c.etl_context_id = $1`, id).Scan(&fetch, &step, &runner); err != nil {
				b.Fatal(err)
			}
			st.fetch = append(st.fetch, fetch)
			st.step = append(st.step, step)
			st.runner = append(st.runner, runner)
		}
		testenv.Eventually(b, 30*time.Second, fmt.Sprintf("probe task %d to settle", id), func() (bool, error) {
			var settled bool
			err := conn.QueryRow(ctx, `
				SELECT c.etl_status = 'DONE' AND j.state = 'completed'
				  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
				 WHERE c.etl_context_id = $1`, id).Scan(&settled)
			return settled, err
		})
	}
	return st
}

func unseenNote(unseen int) string {
	if unseen == 0 {
		return ""
	}
	return fmt.Sprintf(" (WARNING: %d locks not in pg_locks once the pid was recorded)", unseen)
}

type plainArgs struct{}

func (plainArgs) Kind() string { return "scalebench_plain" }

// riverFloor times plain River on the database at url: a job inserted by
// one client (as dama's Client submits), worked by another with a
// supervisor's fetch settings, from Insert returning to Work being called.
func riverFloor(b *testing.B, url string, n int) []time.Duration {
	ctx := context.Background()
	pool := newPool(b, url, "dama-scalebench-river")
	defer pool.Close()
	worked := make(chan time.Time, 1)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[plainArgs]) error {
		worked <- time.Now()
		return nil
	}))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	worker, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{"plain": {MaxWorkers: 32}},
		Workers:           workers,
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            quiet,
	})
	if err != nil {
		b.Fatal(err)
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{FetchCooldown: fetchCooldown, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = worker.Stop(stopCtx)
	}()
	time.Sleep(500 * time.Millisecond)
	const warmup = 3
	var ds []time.Duration
	for i := range n + warmup {
		if _, err := inserter.Insert(ctx, plainArgs{}, &river.InsertOpts{Queue: "plain"}); err != nil {
			b.Fatal(err)
		}
		inserted := time.Now()
		select {
		case at := <-worked:
			if i >= warmup {
				ds = append(ds, at.Sub(inserted))
			}
		case <-time.After(30 * time.Second):
			b.Fatal("plain River job not worked in 30s")
		}
	}
	return ds
}

// forkFloor times the floor binary: from the start of the fork/exec to the
// byte it writes on its readiness pipe once connected and holding its lock,
// spawned as a supervisor spawns a task process (a session of its own,
// stdio on /dev/null, the pipe as fd 3).
func forkFloor(b *testing.B, env *testenv.Env, bin string, n int) []time.Duration {
	const warmup = 3
	var ds []time.Duration
	for i := range n + warmup {
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, strconv.Itoa(i))
		cmd.Env = env.Environ("")
		cmd.ExtraFiles = []*os.File{w}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		var out strings.Builder
		cmd.Stderr = &out
		start := time.Now()
		err = cmd.Start()
		w.Close()
		if err != nil {
			r.Close()
			b.Fatal(err)
		}
		_ = r.SetReadDeadline(time.Now().Add(30 * time.Second))
		var buf [1]byte
		_, err = r.Read(buf[:])
		took := time.Since(start)
		r.Close()
		waitErr := cmd.Wait()
		if err != nil || waitErr != nil {
			b.Fatalf("floor process: %v %v: %s", err, waitErr, out.String())
		}
		if i >= warmup {
			ds = append(ds, took)
		}
	}
	return ds
}

// connect opens a connection named for pg_stat_activity, closed when b ends.
func connect(b *testing.B, url, name string, onNotice pgconn.NoticeHandler) *pgx.Conn {
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

func newPool(b *testing.B, url, name string) *pgxpool.Pool {
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

// A row of the summary: a metric of each run.
type row struct {
	label string
	key   string
	fmt   string
}

var rows = []row{
	{"all N hold their lock after (s)", "start_all_s", "%.1f"},
	{"transactions/s", "tx_s", "%.1f"},
	{"river_job updates/s", "river_upd_s", "%.1f"},
	{"etl_contexts updates/s", "ctx_upd_s", "%.1f"},
	{"dead not removable: river_job", "dead_river", "%.0f"},
	{"dead not removable: etl_contexts", "dead_ctx", "%.0f"},
	{"dead not removable: churn table", "dead_churn", "%.0f"},
	{"server log ERROR lines (window)", "errors", "%.0f"},
	{"supervisor CPU (% of a core)", "sup_cpu", "%.1f"},
	{"supervisor RSS (MB)", "sup_rss", "%.1f"},
	{"task process RSS median (MB)", "runner_rss_med", "%.1f"},
	{"task process RSS max (MB)", "runner_rss_max", "%.1f"},
	{"task process PSS median (MB)", "runner_pss_med", "%.1f"},
	{"task processes CPU, all (% of a core)", "runners_cpu", "%.1f"},
	{"server CPU, all (% of a core)", "server_cpu", "%.1f"},
	{"server connections (less the bench's)", "conns", "%.0f"},
	{"  of the supervisor", "conns_sup", "%.0f"},
	{"  per task", "conns_task", "%.2f"},
	{"plain River insert→Work p50 (ms)", "river_p50", "%.1f"},
	{"plain River insert→Work p99 (ms)", "river_p99", "%.1f"},
	{"fork/exec+connect+lock p50 (ms)", "fork_p50", "%.1f"},
	{"fork/exec+connect+lock p99 (ms)", "fork_p99", "%.1f"},
	{"submit→lock p50, 0 running (ms)", "lock0_p50", "%.1f"},
	{"submit→lock p99, 0 running (ms)", "lock0_p99", "%.1f"},
	{"submit→lock p50, N running (ms)", "lockN_p50", "%.1f"},
	{"submit→lock p99, N running (ms)", "lockN_p99", "%.1f"},
	{"  p50 0 running / (River + fork)", "ratio_floor0", "%.2f"},
	{"  p50 N running / 0 running", "ratio_lock", "%.2f"},
	{"  p50 N running / (River + fork)", "ratio_floor", "%.2f"},
	{"SIGKILL, adopt, exit: all settled (s)", "settle_s", "%.2f"},
	{"  a task's p50 (s)", "settle_p50_s", "%.2f"},
}

func printSummary(w io.Writer, p params, results []*result) {
	fmt.Fprintf(w, "\n== scale: one supervisor, N quiet tasks, window %s ==\n", p.window)
	fmt.Fprintf(w, "%-40s", "")
	for _, r := range results {
		fmt.Fprintf(w, " %14s", r.name())
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		fmt.Fprintf(w, "%-40s", row.label)
		for _, r := range results {
			v := r.get(row.key)
			if math.IsNaN(v) {
				fmt.Fprintf(w, " %14s", "-")
				continue
			}
			fmt.Fprintf(w, " %14s", fmt.Sprintf(row.fmt, v))
		}
		fmt.Fprintln(w)
	}
	for _, r := range results {
		if r.get("complete") != 1 {
			fmt.Fprintf(w, "(%s did not run to the end: see its log above)\n", r.name())
		}
	}
	fmt.Fprintln(w, "\ntargets (a benchmark: reported, never enforced):")
	for _, t := range targets(p, results) {
		fmt.Fprintln(w, "  "+t)
	}
}

// targets checks the figures the issue asks of the new design.
func targets(p params, results []*result) []string {
	var out []string
	verdict := func(ok bool, vals ...float64) string {
		for _, v := range vals {
			if math.IsNaN(v) {
				return "n/a"
			}
		}
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	// The size 0, if measured, is the idle cost: the targets compare the
	// smallest size with tasks to the largest.
	var sizes []int
	for _, n := range p.sizes {
		if n > 0 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		return []string{"(no size with tasks)"}
	}
	small, large := slices.Min(sizes), slices.Max(sizes)
	find := func(mode config.LockMode, n int) *result {
		for _, r := range results {
			if r.mode == mode && r.n == n {
				return r
			}
		}
		return nil
	}
	for _, mode := range p.modes {
		lo, hi := find(mode, small), find(mode, large)
		if small != large {
			a, z := lo.get("tx_s"), hi.get("tx_s")
			out = append(out, fmt.Sprintf("%-8s transactions/s at %d (%.1f) <= 1.5 x at %d (%.1f): %s",
				mode, large, z, small, a, verdict(z <= 1.5*a, a, z)))
		}
		for _, n := range sizes {
			r := find(mode, n)
			tx := r.get("tx_s")
			out = append(out, fmt.Sprintf("%-8s transactions/s at %d (%.1f) <= 20: %s", mode, n, tx, verdict(tx <= 20, tx)))
			e := r.get("errors")
			out = append(out, fmt.Sprintf("%-8s server log ERROR lines at %d (%.0f) = 0: %s", mode, n, e, verdict(e == 0, e)))
			if mode == config.LockModeHost {
				c, limit := r.get("conns"), 40.0
				if n > 300 {
					limit = 60
				}
				out = append(out, fmt.Sprintf("%-8s server connections at %d (%.0f; supervisor %.0f, per task %.3f) <= %.0f: %s",
					mode, n, c, r.get("conns_sup"), r.get("conns_task"), limit, verdict(c <= limit, c)))
				// PSS, not RSS: RSS counts in full the program's pages
				// that every task process of the host shares.
				m := r.get("runner_pss_med")
				out = append(out, fmt.Sprintf("%-8s task process PSS median at %d (%.1f MB; RSS %.1f MB) <= 10 MB: %s",
					mode, n, m, r.get("runner_rss_med"), verdict(m <= 10, m)))
			}
			if mode == config.LockModeAdvisory {
				dr, dc := r.get("dead_river"), r.get("dead_churn")
				out = append(out, fmt.Sprintf("%-8s dead not removable at %d (river_job %.0f, churn %.0f) = 0: %s",
					mode, n, dr, dc, verdict(dr == 0 && dc == 0, dr, dc)))
				c := r.get("conns_task")
				out = append(out, fmt.Sprintf("%-8s connections per task at %d (%.2f; total %.0f, supervisor %.0f) = 1: %s",
					mode, n, c, r.get("conns"), r.get("conns_sup"), verdict(c == 1, c)))
			}
		}
		for _, n := range sizes {
			r := find(mode, n)
			l0, lN, fl := r.get("lock0_p50"), r.get("lockN_p50"), r.get("river_p50")+r.get("fork_p50")
			out = append(out, fmt.Sprintf("%-8s submit→lock p50 at 0 running (%.1f ms) <= 1.2 x River + fork/exec (%.1f ms): %s",
				mode, l0, fl, verdict(l0 <= 1.2*fl, l0, fl)))
			out = append(out, fmt.Sprintf("%-8s submit→lock p50 at %d running (%.1f ms) <= 1.2 x River + fork/exec (%.1f ms): %s",
				mode, n, lN, fl, verdict(lN <= 1.2*fl, lN, fl)))
		}
	}
	return out
}

// keeperPIDs returns the pids of the lock keepers of the task processes
// logging in logDir, which each writes in its lock file (host lock mode).
func keeperPIDs(logDir string) []int {
	locks, _ := filepath.Glob(filepath.Join(logDir, ".keeper", "*.sock.lock"))
	var pids []int
	for _, l := range locks {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
