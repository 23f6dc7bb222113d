package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A fetch whose statement commits while its answer is lost leaves its jobs
// running under a live supervisor that never received them: here the fault
// is a synchronous standby that vanished, so that the fetch's commit waits
// past River's 10 s fetch timeout and completes once the standby is no
// longer required. (A chaos run hit it in a failover: 11 tasks stayed
// QUEUED with their jobs running for the half hour of a Work's timeout.)
// The supervisor finds that no Work of it received the fetch, and rescues
// its jobs: the task runs.
func TestAFetchWhoseAnswerWasLostIsRescued(t *testing.T) {
	srv := testenv.NewServerWith(t, "synchronous_commit = on")
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	cfg := loadTestConfig(t, env)

	// The test's own writes commit locally, whatever the standby.
	local, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	local.ConnConfig.RuntimeParams["synchronous_commit"] = "local"
	admin, err := pgxpool.NewWithConfig(ctx, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	requireStandby := func(name string) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, name)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}

	pool, err := pgxpool.New(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := &lostHeard{}
	s, err := New(pool, cfg, Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	})
	// Before the supervisor stops, whatever the outcome: every commit
	// waiting for the standby completes.
	t.Cleanup(func() { requireStandby("") })
	testenv.Eventually(t, time.Minute, "the supervisor to start", func() (bool, error) {
		select {
		case <-s.Started():
			return true, nil
		case err := <-ran:
			t.Fatalf("the supervisor stopped: %v", err)
		default:
		}
		return false, nil
	})
	client, err := dama.NewClient(admin, cfg)
	if err != nil {
		t.Fatal(err)
	}

	// A task whose job its Work holds all along, past the rescue grace:
	// never given back.
	until := filepath.Join(env.Dir, "held.until")
	held, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "sample", Args: json.RawMessage(fmt.Sprintf(`{"steps": 1, "step_ms": 1, "until_file": %q}`, until))})
	if err != nil {
		t.Fatal(err)
	}
	env.WaitForTask(held, time.Minute, "the held task RUNNING", func(task etlcontext.Task) bool {
		return task.Status == etlcontext.StatusRunning && task.PID != nil
	})

	requireStandby("dama_test_absent")
	// The server's checkpointer, once it has read the new setting, makes
	// commits wait: a commit of a probe's waits then.
	probeConf, err := pgx.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	probeConf.RuntimeParams["application_name"] = "dama-test-standby-probe"
	// A commit that wrote nothing in the WAL waits for no standby.
	if _, err := admin.Exec(ctx, `CREATE TABLE standby_probe (n int)`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "commits to wait for the absent standby", func() (bool, error) {
		conn, err := pgx.ConnectConfig(ctx, probeConf)
		if err != nil {
			return false, err
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = conn.Exec(pctx, `INSERT INTO standby_probe VALUES (1)`)
		conn.Close(ctx)
		if err == nil {
			return false, errors.New("a commit did not wait")
		}
		var waiting bool
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		defer lcancel()
		if err := admin.QueryRow(lctx, `
			SELECT count(*) > 0 FROM pg_stat_activity
			 WHERE application_name = 'dama-test-standby-probe' AND wait_event = 'SyncRep'`).Scan(&waiting); err != nil {
			return false, err
		}
		return waiting, errors.New("the probe's commit failed without waiting for the standby")
	})
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "sample"})
	if err != nil {
		t.Fatal(err)
	}
	// The fetch's commit waits for the standby; River gives up on it after
	// 10 s and closes its connection.
	var backend, clientPort int
	testenv.Eventually(t, time.Minute, "River's fetch waiting for the standby", func() (bool, error) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := admin.QueryRow(lctx, `
			SELECT pid, client_port FROM pg_stat_activity
			 WHERE wait_event = 'SyncRep' AND query LIKE '%locked_jobs%'`).Scan(&backend, &clientPort)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, errors.New("no fetch waits for the standby")
		}
		return err == nil, err
	})
	testenv.Eventually(t, time.Minute, fmt.Sprintf("River to hang up on its fetch (backend %d, client port %d)", backend, clientPort), func() (bool, error) {
		established, err := tcpEstablished(srv.Port(), clientPort)
		return !established, err
	})
	s.mu.Lock()
	for f := range s.begun {
		if f.jobID == id {
			t.Errorf("a Work received the fetch of job %d: its answer was not lost", f.jobID)
		}
	}
	s.mu.Unlock()
	requireStandby("")

	// Fetched for nobody: running under the live supervisor's client.
	var client0 string
	if err := admin.QueryRow(ctx, `
		SELECT j.attempted_by[array_length(j.attempted_by, 1)]
		  FROM river_job AS j JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
		 WHERE c.etl_context_id = $1 AND j.state = 'running'`, id).Scan(&client0); err != nil {
		t.Fatalf("the lost fetch's job is not running: %v", err)
	}
	if client0 != s.river.ID() {
		t.Fatalf("the job runs under client %q, not the supervisor's %q", client0, s.river.ID())
	}
	began := time.Now()
	env.WaitForTask(id, 2*time.Minute, "the task of the lost fetch DONE", func(task etlcontext.Task) bool {
		return task.Status == etlcontext.StatusDone
	})
	t.Logf("task %d DONE %s after its lost fetch committed (rescue grace %s)", id, time.Since(began).Round(time.Millisecond), s.rescueGrace)

	if err := os.WriteFile(until, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if task := env.WaitForTask(held, time.Minute, "the held task DONE", func(task etlcontext.Task) bool {
		return task.Status == etlcontext.StatusDone
	}); task.Attempt != 1 {
		t.Errorf("the held task took %d attempts", task.Attempt)
	}
	if got, tasks := logs.jobIDs(); len(got) != 1 || got[0] != jobOf(t, admin, id) || len(tasks) != 1 || tasks[0] != id {
		t.Errorf("jobs given back as a lost fetch's: %v of tasks %v, want only task %d's", got, tasks, id)
	}
}

func jobOf(t *testing.T, db *pgxpool.Pool, id int64) int64 {
	t.Helper()
	var job int64
	if err := db.QueryRow(context.Background(), `SELECT river_job_id FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&job); err != nil {
		t.Fatal(err)
	}
	return job
}

// lostHeard is a log handler that discards every record, but keeps the job
// and task ids of those that give back the jobs of a lost fetch.
type lostHeard struct {
	mu         sync.Mutex
	ids, tasks []int64
}

func (h *lostHeard) Enabled(context.Context, slog.Level) bool { return true }
func (h *lostHeard) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *lostHeard) WithGroup(string) slog.Handler            { return h }

func (h *lostHeard) Handle(_ context.Context, r slog.Record) error {
	if r.Message != lostFetchLine {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		ids, ok := a.Value.Any().([]int64)
		h.mu.Lock()
		switch {
		case ok && a.Key == "job_ids":
			h.ids = append(h.ids, ids...)
		case ok && a.Key == "etl_context_ids":
			h.tasks = append(h.tasks, ids...)
		}
		h.mu.Unlock()
		return true
	})
	return nil
}

func (h *lostHeard) jobIDs() (jobs, tasks []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ids), slices.Clone(h.tasks)
}

// tcpEstablished reports whether the TCP connection on the loopback from
// clientPort to serverPort is established, as its server side sees it
// (/proc/net/tcp): once the client closed it, it is in CLOSE_WAIT.
func tcpEstablished(serverPort, clientPort int) (bool, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	defer f.Close()
	local := fmt.Sprintf("0100007F:%04X", serverPort)
	remote := fmt.Sprintf("0100007F:%04X", clientPort)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st ...
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && fields[1] == local && fields[2] == remote {
			return fields[3] == "01", nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, fmt.Errorf("no connection %s -> %s in /proc/net/tcp", remote, local)
}
