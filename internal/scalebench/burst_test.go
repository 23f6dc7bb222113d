package scalebench_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	srv := testenv.NewServerWith(b, fmt.Sprintf("max_connections = %d", 3*w+200))
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
	xacts, cpu, start := transactions(b, pool), machineCPU(b), time.Now()
	if _, err := client.InsertMany(ctx, params); err != nil {
		b.Fatal(err)
	}
	waitCount(b, pool, `SELECT count(*) FROM river_job WHERE state = 'completed'`, n, 10*time.Minute)
	took := time.Since(start)
	perTask(b, pool, "floor", n, xacts, cpu)
	return took
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

// perTask prints the CPU the machine spent per task since cpu, and the
// database's transactions per task since xacts once its backends reported
// them.
func perTask(b *testing.B, pool *pgxpool.Pool, who string, n int, xacts int64, cpu time.Duration) {
	used := machineCPU(b) - cpu
	// An idle backend reports its transactions to pg_stat_database up to
	// 10 s late, by a timer no query can hurry for another session.
	time.Sleep(11 * time.Second) // deliberately: the server's statistics delay
	fmt.Printf("%s: %.1f ms of CPU (the whole machine's) and %.1f transactions per task\n",
		who, scalebench.Millis(used)/float64(n), float64(transactions(b, pool)-xacts-1)/float64(n))
	// The rows each table had written per task, the most first.
	rows, err := pool.Query(context.Background(), `
		SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_del
		  FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0
		 ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC`)
	if err != nil {
		b.Fatal(err)
	}
	var writes []string
	for rows.Next() {
		var (
			table         string
			ins, upd, del float64
		)
		if err := rows.Scan(&table, &ins, &upd, &del); err != nil {
			b.Fatal(err)
		}
		writes = append(writes, fmt.Sprintf("%s %.1f/%.1f/%.1f", table, ins/float64(n), upd/float64(n), del/float64(n)))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("%s: rows inserted/updated/deleted per task: %s\n", who, strings.Join(writes, ", "))
}

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
	pool := newPool(b, env.URL, "dama-scalebench-burst")
	defer pool.Close()
	xacts, cpu, start := transactions(b, pool), machineCPU(b), time.Now()
	if _, err := pool.Exec(ctx, `SELECT data_manager.submit($1) FROM generate_series(1, $2::int)`, burstKind, n); err != nil {
		b.Fatal(err)
	}
	waitCount(b, pool, `
		SELECT count(*) FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_status = 'DONE' AND j.state = 'completed'`, n, 10*time.Minute)
	took := time.Since(start)
	perTask(b, pool, "dama "+string(mode), n, xacts, cpu)

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
