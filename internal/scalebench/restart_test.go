package scalebench_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// restartAndSettle SIGKILLs the supervisor, starts another, lets it adopt
// the tasks, then makes every quiet task's command exit at once and times
// how long until all are DONE with their River job completed.
func restartAndSettle(b *testing.B, p params, r *result, env *testenv.Env, sup *testenv.Proc, cfgPath string, mon *pgx.Conn, bins helpers, release string) {
	ctx := context.Background()
	sup.Kill(b, syscall.SIGKILL)
	_ = sup.Wait()
	sup2 := env.Start(cfgPath, "supervisor")
	clientID := waitStarted(b, sup2)
	started := time.Now()
	var ids []int64
	rows, err := mon.Query(ctx, `SELECT etl_context_id FROM data_manager.etl_contexts WHERE kind = $1`, quietKind)
	if err == nil {
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		b.Fatal(err)
	}
	waitAdopted(b, mon, ids, []string{clientID}, p.adoptWait)
	r.m["adopt_s"] = time.Since(started).Seconds()
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
	r.say("SIGKILLed the supervisor; the new one adopted all %d %.1f s after it started, and all still hold their lock; their jobs: %s",
		r.n, r.m["adopt_s"], states)

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
	// The fallback for a command not found (it looks once a minute).
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if signalled != r.n {
		r.say("WARNING: signalled %d commands of %d; the others exit within a minute of the release file", signalled, r.n)
	}
	lastReport := t0
	testenv.Eventually(b, 10*time.Minute-time.Since(t0), "every quiet task DONE with its job completed, after their commands exited", func() (bool, error) {
		var settled, done int
		if err := mon.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE c.etl_status = 'DONE' AND j.state = 'completed'), count(*) FILTER (WHERE c.etl_status = 'DONE')
			  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.kind = $1`, quietKind).Scan(&settled, &done); err != nil {
			b.Fatal(err)
		}
		if time.Since(lastReport) > 10*time.Second {
			fmt.Fprintf(os.Stderr, "[%s] settling: %d of %d DONE, %d with their job completed\n", r.name(), done, r.n, settled)
			lastReport = time.Now()
		}
		return settled == r.n, fmt.Errorf("%d of %d tasks settled (%d DONE)", settled, r.n, done)
	})
	r.m["settle_s"] = time.Since(t0).Seconds()
	rows, err = mon.Query(ctx, `
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

// waitAdopted waits, at most timeout, until the job of every context of
// ids is running again, last fetched by one of clients: adopted by a
// supervisor whose Work holds it until the task ends.
func waitAdopted(tb testing.TB, mon *pgx.Conn, ids []int64, clients []string, timeout time.Duration) {
	var adopted int
	testenv.EventuallyEvery(tb, 100*time.Millisecond, timeout, "the live supervisors to adopt every task", func() (bool, error) {
		err := mon.QueryRow(context.Background(), `
			SELECT count(*) FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.etl_context_id = ANY($1) AND j.state = 'running' AND j.attempted_by[array_upper(j.attempted_by, 1)] = ANY($2)`, ids, clients).Scan(&adopted)
		return adopted == len(ids), fmt.Errorf("%d of %d adopted (%v)", adopted, len(ids), err)
	})
}

// waitStarted waits for the supervisor's "supervisor started" log line and
// returns its River client id.
func waitStarted(tb testing.TB, sup *testenv.Proc) string {
	re := regexp.MustCompile(`msg="supervisor started".* client_id=("[^"]*"|\S+)`)
	var id string
	testenv.Eventually(tb, time.Minute, "the supervisor to start", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		if m := re.FindSubmatch(log); m != nil {
			id = strings.Trim(string(m[1]), `"`)
			return true, nil
		}
		return false, err
	})
	return id
}

// waitLocked waits until all r.n quiet tasks hold their lock, at most
// timeout from since.
func waitLocked(b *testing.B, r *result, mon *pgx.Conn, since time.Time, timeout time.Duration) {
	ctx := context.Background()
	lastReport := time.Now()
	// Once a second: the benchmark measures the server, which looking at
	// 1000 locks more often would load.
	testenv.EventuallyEvery(b, time.Second, timeout-time.Since(since), fmt.Sprintf("all %d tasks to hold their lock", r.n), func() (bool, error) {
		var locked, finished, retried int
		if err := mon.QueryRow(ctx, lockQuery, quietKind, protocol.LockNamespace).Scan(&locked, &finished, &retried); err != nil {
			b.Fatal(err)
		}
		if finished > 0 || retried > 0 {
			b.Fatalf("%d quiet tasks finished and %d were retried while starting", finished, retried)
		}
		if time.Since(lastReport) >= 10*time.Second {
			fmt.Fprintf(os.Stderr, "[%s] %d of %d hold their lock after %.0f s\n", r.name(), locked, r.n, time.Since(since).Seconds())
			lastReport = time.Now()
		}
		return locked == r.n, fmt.Errorf("%d of %d hold their lock", locked, r.n)
	})
}
