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

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

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
func probe(b *testing.B, client *dama.Client, conn *pgx.Conn, n int) (st probes) {
	ctx := context.Background()
	const warmup = 2
	for i := range n + warmup {
		id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: probeKind})
		if err != nil {
			b.Fatal(err)
		}
		submitted := time.Now()
		testenv.EventuallyEvery(b, time.Millisecond, 30*time.Second, fmt.Sprintf("probe task %d to start", id), func() (bool, error) {
			var started bool
			if err := conn.QueryRow(ctx, `SELECT pid IS NOT NULL FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&started); err != nil {
				b.Fatal(err)
			}
			if started && i >= warmup {
				st.ds = append(st.ds, time.Since(submitted))
			}
			return started, nil
		})
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
	// The first samples, taken while River's producers start, are the
	// warm-up's, not measured.
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
