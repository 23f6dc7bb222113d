package scalebench_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
)

// burstKind is the kind of the burst's tasks, and burstFloorArgs the job of
// its floor.
const burstKind = "burst"

type burstFloorArgs struct{}

func (burstFloorArgs) Kind() string { return "scalebench_burst_floor" }

// BenchmarkBurst measures a burst of N short tasks (/bin/true), submitted in
// one SQL statement to a queue of W slots, in each lock mode
// (DAMA_BENCH_MODES, all three by default), beside its floor: plain River
// with W workers, each job's Work starting a process that connects, takes
// an advisory lock and exits, then running /bin/true and recording that it
// ran. Everything runs on one PostgreSQL server of its own, each in a
// database of its own. For each it prints the time until all N are done,
// tasks/s, the ratio to the floor, and for dama the slots' occupancy (the
// time the attempts ran, over the burst's time and W) and how long after
// each task's end its River job was finalized (p50, p90).
//
// Run it with scripts/bench.sh burst [N [W]].
func BenchmarkBurst(b *testing.B) {
	n, err := strconv.Atoi(envOr("DAMA_BENCH_BURST_N", "1000"))
	if err != nil || n < 1 {
		b.Fatalf("DAMA_BENCH_BURST_N: %q is not a positive number", os.Getenv("DAMA_BENCH_BURST_N"))
	}
	w, err := strconv.Atoi(envOr("DAMA_BENCH_BURST_W", "20"))
	if err != nil || w < 1 {
		b.Fatalf("DAMA_BENCH_BURST_W: %q is not a positive number", os.Getenv("DAMA_BENCH_BURST_W"))
	}
	var modes []config.LockMode
	for _, s := range strings.Split(envOr("DAMA_BENCH_MODES", "host,advisory,row"), ",") {
		m := config.LockMode(strings.TrimSpace(s))
		if !m.Valid() {
			b.Fatalf("DAMA_BENCH_MODES: %q is not a lock mode (row, advisory, host)", s)
		}
		modes = append(modes, m)
	}
	bins := buildHelpers(b)
	// pg_stat_statements counts the round trips (top-level statements) a
	// task costs, and which they are.
	srv := testenv.NewServerWith(b, fmt.Sprintf("max_connections = %d\nshared_preload_libraries = 'pg_stat_statements'", 3*w+200))
	fmt.Printf("burst benchmark: %d tasks of /bin/true, %d slots, PostgreSQL on 127.0.0.1:%d\n", n, w, srv.Port())
	floor := burstFloor(b, testenv.NewOn(b, srv), bins.floor, n, w)
	fmt.Printf("floor (plain River, %d workers, fork/exec + connect + lock, /bin/true, a row): %d done in %.2f s, %.0f tasks/s\n",
		w, n, floor.Seconds(), float64(n)/floor.Seconds())
	for _, mode := range modes {
		b.Run(string(mode), func(b *testing.B) {
			burstDama(b, testenv.NewOn(b, srv), mode, n, w, floor)
		})
	}
}

// burstFloor runs the floor's burst and returns how long all n took, from
// their insertion in one statement.
func burstFloor(b *testing.B, env *testenv.Env, floorBin string, n, w int) time.Duration {
	ctx := context.Background()
	pool := newPool(b, env.URL, "dama-scalebench-burst-floor")
	defer pool.Close()
	watch := newWatcher(b, env)
	if _, err := pool.Exec(ctx, `CREATE TABLE burst_ran (job bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		b.Fatal(err)
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devNull.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[burstFloorArgs]) error {
		lock := exec.CommandContext(ctx, floorBin, strconv.FormatInt(job.ID, 10))
		lock.Env = env.Environ("")
		lock.ExtraFiles = []*os.File{devNull}
		lock.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if out, err := lock.CombinedOutput(); err != nil {
			return fmt.Errorf("floor process: %w: %s", err, out)
		}
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `INSERT INTO burst_ran (job) VALUES ($1)`, job.ID)
		return err
	}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{"burst": {MaxWorkers: w}},
		Workers:           workers,
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: burstFloorArgs{}, InsertOpts: &river.InsertOpts{Queue: "burst"}}
	}
	from := counting(b, watch, 0)
	start := time.Now()
	if _, err := client.InsertMany(ctx, params); err != nil {
		b.Fatal(err)
	}
	waitCount(b, watch, `SELECT count(*) FROM river_job WHERE state = 'completed'`, n, 10*time.Minute)
	took := time.Since(start)
	perTask(b, watch, "floor", n, 0, from)
	return took
}

// watcherRole is the role the benchmark watches and submits as, whose
// statements are not the tasks'.
const watcherRole = "dama_bench_watcher"

// newWatcher returns a pool of env's database, as watcherRole, and sets up
// pg_stat_statements there.
func newWatcher(b *testing.B, env *testenv.Env) *pgxpool.Pool {
	admin := newPool(b, env.URL, "dama-scalebench-burst-setup")
	defer admin.Close()
	if _, err := admin.Exec(context.Background(), `
		DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+watcherRole+`') THEN
				CREATE ROLE `+watcherRole+` SUPERUSER LOGIN;
			END IF;
		END $$;
		CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	u, err := url.Parse(env.URL)
	if err != nil {
		b.Fatal(err)
	}
	u.User = url.User(watcherRole)
	return newPool(b, u.String(), "dama-scalebench-burst")
}

// transactions is what pg_stat_database counts of the database's
// transactions.
func transactions(b *testing.B, pool *pgxpool.Pool) int64 {
	var n int64
	if err := pool.QueryRow(context.Background(), `
		SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// counts are a burst's counts so far: the database's transactions, and
// the CPU time of the machine and of who spent it.
type counts struct {
	xacts int64
	cpu   cpuShares
}

// cpuShares is CPU time by who spent it: the machine, PostgreSQL (its
// postmaster, its backends, those that exited included), and for dama the
// supervisor itself and its task processes: those it reaped with their
// commands, and those alive (a lock keeper).
type cpuShares struct {
	machine, postgres, supervisor, reaped, alive time.Duration
}

// counting starts the counts of a burst, pg_stat_statements' anew; sup is
// the supervisor's process id, or 0.
func counting(b *testing.B, pool *pgxpool.Pool, sup int) counts {
	if _, err := pool.Exec(context.Background(), `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
	return counts{xacts: transactions(b, pool), cpu: shares(b, pool, sup)}
}

// shares reads the CPU time spent so far by the machine and by each of
// the processes of cpuShares.
func shares(b *testing.B, pool *pgxpool.Pool, sup int) cpuShares {
	var backend int
	if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	c := cpuShares{machine: machineCPU(b)}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	postmaster := procStat(backend).ppid
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st := procStat(pid)
		switch {
		case pid == postmaster:
			c.postgres += st.self + st.children
		case st.ppid == postmaster:
			c.postgres += st.self
		case pid == sup:
			c.supervisor += st.self
			c.reaped += st.children
		case sup != 0 && (st.comm == "dama" || st.comm == "dama-taskrunner"):
			c.alive += st.self
		}
	}
	return c
}

// stat is what /proc/PID/stat says of a process: its name, parent, and
// its own and its waited-for descendants' CPU time. A process gone is
// all zero.
type stat struct {
	comm           string
	ppid           int
	self, children time.Duration
}

func procStat(pid int) stat {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}
	}
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return stat{}
	}
	// After the name: state ppid ... utime(14) stime cutime cstime.
	f := strings.Fields(string(data[end+1:]))
	if len(f) < 15 {
		return stat{}
	}
	num := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i-3], 10, 64)
		return time.Duration(v) * 10 * time.Millisecond
	}
	ppid, _ := strconv.Atoi(f[1])
	return stat{comm: string(data[open+1 : end]), ppid: ppid, self: num(14) + num(15), children: num(16) + num(17)}
}

// machineCPU is the CPU time the whole machine has spent (/proc/stat).
func machineCPU(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	var ticks int64
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, f := range fields[1:min(9, len(fields))] {
		if i == 3 || i == 4 {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// perTask prints, per task since from, the CPU the machine spent and who
// spent it, and the database's transactions once its backends reported
// them.
func perTask(b *testing.B, pool *pgxpool.Pool, who string, n int, sup int, from counts) {
	now := shares(b, pool, sup)
	ms := func(d time.Duration) float64 { return scalebench.Millis(d) / float64(n) }
	// An idle backend reports its transactions to pg_stat_database up to
	// 10 s late, by a timer no query can hurry for another session.
	time.Sleep(11 * time.Second) // deliberately: the server's statistics delay
	fmt.Printf("%s: %.1f ms of CPU (the whole machine's) and %.1f transactions per task\n",
		who, ms(now.machine-from.cpu.machine), float64(transactions(b, pool)-from.xacts-1)/float64(n))
	fmt.Printf("%s: CPU per task by process: PostgreSQL %.1f ms", who, ms(now.postgres-from.cpu.postgres))
	if sup != 0 {
		fmt.Printf(", supervisor %.1f ms, task processes and their commands (the lock keeper included) %.1f ms",
			ms(now.supervisor-from.cpu.supervisor), ms(now.reaped+now.alive-from.cpu.reaped-from.cpu.alive))
	}
	fmt.Println()
	// The rows each table had written per task, the most first.
	rows, err := pool.Query(context.Background(), `
		SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
		  FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0
		 ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC`)
	if err != nil {
		b.Fatal(err)
	}
	var writes []string
	for rows.Next() {
		var (
			table              string
			ins, upd, hot, del float64
		)
		if err := rows.Scan(&table, &ins, &upd, &hot, &del); err != nil {
			b.Fatal(err)
		}
		writes = append(writes, fmt.Sprintf("%s %.1f/%.1f (%.1f HOT)/%.1f", table, ins/float64(n), upd/float64(n), hot/float64(n), del/float64(n)))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	// A HOT update writes no index entry.
	fmt.Printf("%s: rows inserted/updated (of which HOT)/deleted per task: %s\n", who, strings.Join(writes, ", "))
	statements(b, pool, who, n)
}

// statements prints the statements per task that others than the watcher
// sent (pg_stat_statements' top-level calls: round trips, transaction
// control included), in all and the most frequent.
func statements(b *testing.B, pool *pgxpool.Pool, who string, n int) {
	rows, err := pool.Query(context.Background(), `
		SELECT s.calls, s.total_exec_time, s.shared_blks_hit + s.shared_blks_read, regexp_replace(s.query, '\s+', ' ', 'g')
		  FROM pg_stat_statements AS s
		 WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = $1)
		 ORDER BY s.calls DESC`, watcherRole)
	if err != nil {
		b.Fatal(err)
	}
	type stmt struct {
		Calls int64
		Time  float64
		Pages int64
		Query string
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stmt])
	if err != nil {
		b.Fatal(err)
	}
	var (
		total int64
		took  float64
	)
	for _, s := range all {
		total += s.Calls
		took += s.Time
	}
	fmt.Printf("%s: %.1f statements per task (round trips, BEGIN and COMMIT included), executing for %.2f ms; the most frequent, as calls, ms and pages read per task:\n",
		who, float64(total)/float64(n), took/float64(n))
	for _, s := range all[:min(len(all), statementsShown)] {
		q := s.Query
		if len(q) > 100 {
			q = q[:100] + "..."
		}
		fmt.Printf("  %5.2f %7.3f %6.1f  %s\n", float64(s.Calls)/float64(n), s.Time/float64(n), float64(s.Pages)/float64(n), q)
	}
}

// statementsShown is how many statements the benchmark lists per run.
const statementsShown = 25

// burstDama runs the burst through a dama supervisor in lock mode mode.
func burstDama(b *testing.B, env *testenv.Env, mode config.LockMode, n, w int, floor time.Duration) {
	ctx := context.Background()
	cfgPath := env.WriteConfig(fmt.Sprintf(`
lock_mode: %s
log_dir: {{dir}}/logs
queues:
  default: { max_running: %d }
kinds:
  %s:
    command: ["/bin/true"]
`, mode, w, burstKind))
	sup := env.Start(cfgPath, "supervisor")
	waitStarted(b, sup)
	pool := newWatcher(b, env)
	from := counting(b, pool, sup.Cmd.Process.Pid)
	start := time.Now()
	if _, err := pool.Exec(ctx, `SELECT data_manager.submit($1) FROM generate_series(1, $2::int)`, burstKind, n); err != nil {
		b.Fatal(err)
	}
	waitCount(b, pool, `
		SELECT count(*) FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_status = 'DONE' AND j.state = 'completed'`, n, 10*time.Minute)
	took := time.Since(start)
	perTask(b, pool, "dama "+string(mode), n, sup.Cmd.Process.Pid, from)

	var occupancy, p50, p90 float64
	if err := pool.QueryRow(ctx, `
		WITH a AS (
			SELECT a.started_at, a.ended_at, j.finalized_at
			  FROM data_manager.etl_attempts AS a
			  JOIN data_manager.etl_contexts AS c USING (etl_context_id)
			  JOIN river_job AS j ON j.id = c.river_job_id)
		SELECT sum(extract(epoch FROM ended_at - started_at))
		         / extract(epoch FROM max(ended_at) - min(started_at)) / $1,
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - ended_at)) * 1000,
		       percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - ended_at)) * 1000
		  FROM a`, w).Scan(&occupancy, &p50, &p90); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("dama %s: %d done in %.2f s, %.0f tasks/s, %.2fx the floor; slots running a task %.1f of %d on average; job finalized after its task ended p50 %.0f ms, p90 %.0f ms\n",
		mode, n, took.Seconds(), float64(n)/took.Seconds(), took.Seconds()/floor.Seconds(), occupancy*float64(w), w, p50, p90)
	b.ReportMetric(took.Seconds()/floor.Seconds(), "x-floor")
	b.ReportMetric(occupancy*float64(w), "slots-busy")
	b.ReportMetric(p90, "ms-finalize-p90")
}

// waitCount waits until query counts want, polling every 10 ms: a
// benchmark's clock, not a test's wait.
func waitCount(b *testing.B, pool *pgxpool.Pool, query string, want int, timeout time.Duration) {
	testenv.EventuallyEvery(b, 10*time.Millisecond, timeout, fmt.Sprintf("%d done", want), func() (bool, error) {
		var got int
		err := pool.QueryRow(context.Background(), query).Scan(&got)
		return got >= want, err
	})
}
