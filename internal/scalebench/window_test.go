package scalebench_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
)

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
	time.Sleep(p.window) // deliberately: the measured window
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
	conns, err := scalebench.ConnectionsTo(srv.Port(), slices.Concat([]int{self, supPID}, runners, keepers))
	if err != nil {
		b.Fatal(err)
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
	r.say("server connections: %d client backends: supervisor %d, task processes and lock keeper (%d) %d (%.2f per task), the bench's own %d, other %d",
		total, conns[supPID], len(keepers), tasks, r.m["conns_task"], conns[self], total-conns[self]-conns[supPID]-tasks)

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
