package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/internal/etlcontext"
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
	// Before the server goes, whatever the outcome: every waiting commit
	// completes.
	t.Cleanup(func() { requireStandby("") })

	pool, err := pgxpool.New(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, cfg, Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
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

	requireStandby("dama_test_absent")
	client, err := NewClient(admin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, SubmitParams{Kind: "sample"})
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
	return false, sc.Err()
}
