package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/internal/testenv"
)

// steadyConfig runs quiet tasks: a command that waits an hour and costs
// nothing meanwhile.
const steadyConfig = `
lock_mode: %s
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
queues:
  quiet: { max_running: 100 }
kinds:
  quiet:
    queue: quiet
    command: ["/bin/sleep", "3600"]
`

// TestSteadyStateCostsNothingPerTask runs a supervisor with 4 and then 40
// quiet tasks, in each lock mode, on a private server, and checks what the
// issue asks of a steady state:
//
//   - the statements the server runs in a window (pg_stat_statements) do not
//     grow with the number of running tasks: no task is polled, fetched,
//     snoozed or heartbeated;
//   - no ERROR line reaches the server's log (no failing NOWAIT);
//   - each task holds 2 connections in row mode, 1 in advisory mode;
//   - VACUUM removes the dead rows of a busy table while advisory-mode tasks
//     run, and cannot while row-mode tasks hold their lock transactions.
func TestSteadyStateCostsNothingPerTask(t *testing.T) {
	for _, mode := range []string{"row", "advisory"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := testenv.NewServerWith(t, "shared_preload_libraries = 'pg_stat_statements'")
			env := testenv.NewOn(t, srv)
			ctx := context.Background()
			if _, err := env.Pool.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
				t.Fatal(err)
			}
			cfg := env.WriteConfig(fmt.Sprintf(steadyConfig, mode))
			sup := env.Start(cfg, "supervisor")

			submit := func(n int) {
				for range n {
					if res := env.Dama(cfg, "submit", "quiet"); res.Code != 0 {
						t.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
					}
				}
			}
			waitLocked := func(n int) {
				testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d tasks to hold their lock", n), func() (bool, error) {
					var locked int
					err := env.Pool.QueryRow(ctx, `
						SELECT count(*) FROM data_manager.dama_task_queue
						 WHERE etl_status = 'RUNNING' AND pid IS NOT NULL AND initial_event_locked`).Scan(&locked)
					return locked == n, err
				})
				// Each running task's job is held by a Work, which waits on
				// no connection: the window starts once every job is.
				testenv.Eventually(t, 30*time.Second, "every running task's job to be held", func() (bool, error) {
					var running, other int
					err := env.Pool.QueryRow(ctx, `
						SELECT count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state <> 'running')
						  FROM river_job`).Scan(&running, &other)
					return running == n && other == 0, err
				})
			}
			statements := func() int64 {
				var n int64
				if err := env.Pool.QueryRow(ctx, `
					SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
					 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			// window counts the statements of 10 poll intervals.
			window := func() int64 {
				before := statements()
				time.Sleep(5 * time.Second) // deliberately: the measured window
				return statements() - before - 1
			}
			taskConns := func() int {
				var n int
				if err := env.Pool.QueryRow(ctx, `
					SELECT count(*) FROM pg_stat_activity
					 WHERE datname = current_database() AND application_name LIKE 'dama-task%'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			perTask := map[string]int{"row": 2, "advisory": 1}[mode]

			// The budget at start: max_running 100 against the private
			// server's 200 connections (197 for non-superusers), which row
			// mode, with the supervisor's own 23, exceeds.
			testenv.Eventually(t, 30*time.Second, "the supervisor to log its connection budget", func() (bool, error) {
				log, err := os.ReadFile(sup.Log)
				return strings.Contains(string(log), "need_row_mode=200"), err
			})
			log, _ := os.ReadFile(sup.Log)
			for _, want := range []string{"max_tasks=100", "need_advisory_mode=100", fmt.Sprintf("need_as_configured=%d", 100*perTask), "server_max_connections=197"} {
				if !strings.Contains(string(log), want) {
					t.Errorf("the supervisor's budget line lacks %s:\n%s", want, log)
				}
			}
			if warned := strings.Contains(string(log), "the server allows fewer connections"); warned != (mode == "row") {
				t.Errorf("budget warning logged: %t, want %t:\n%s", warned, mode == "row", log)
			}

			submit(4)
			waitLocked(4)
			logFrom := len(srv.Log())
			few := window()
			if got := taskConns(); got != 4*perTask {
				t.Errorf("4 tasks hold %d connections, want %d", got, 4*perTask)
			}
			submit(36)
			waitLocked(40)
			logFrom2 := len(srv.Log())
			many := window()
			if got := taskConns(); got != 40*perTask {
				t.Errorf("40 tasks hold %d connections, want %d", got, 40*perTask)
			}
			t.Logf("%s mode: %d statements in 5s with 4 tasks running, %d with 40", mode, few, many)
			// Per task and poll, the code before this test did a fetch, a
			// snooze, a step and a heartbeat: 36 more tasks would add
			// hundreds of statements to the window.
			select {
			case <-sup.Done():
				log, _ := os.ReadFile(sup.Log)
				t.Fatalf("the supervisor exited during the test: %v\n%s", sup.Wait(), log)
			default:
			}
			if few == 0 || many == 0 {
				t.Fatalf("no statement at all in a window: the supervisor is stuck")
			}
			if many > few+few/2+20 {
				t.Errorf("statements grow with the running tasks: %d with 4 tasks, %d with 40", few, many)
			}
			for _, from := range []int{logFrom, logFrom2} {
				if errs := errorLines(srv.Log()[from:]); len(errs) > 0 {
					t.Errorf("%d ERROR lines in the server log in a steady state, first: %s", len(errs), errs[0])
				}
			}

			dead := churn(t, env)
			if mode == "row" && dead == 0 {
				t.Errorf("VACUUM removed every dead row while row-mode tasks held their lock transactions: the test proves nothing")
			}
			if mode == "advisory" && dead > 0 {
				t.Errorf("VACUUM left %d dead rows it could not remove while advisory-mode tasks ran", dead)
			}
		})
	}
}

var errorLineRE = regexp.MustCompile(`(?m)^.*\bERROR:.*$`)

func errorLines(log string) []string { return errorLineRE.FindAllString(log, -1) }

var notRemovableRE = regexp.MustCompile(`(\d+) are dead but not yet removable`)

// churn updates a table of the test's many times, then vacuums it, and
// returns how many dead row versions VACUUM reported it could not remove.
// A transaction that was open before the updates (a row-mode task's lock
// transaction) keeps them; anything else lasts milliseconds, so the vacuum
// is tried again a few times before a dead row counts.
func churn(t *testing.T, env *testenv.Env) int {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message+" "+n.Detail) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		`CREATE TABLE churn (id int PRIMARY KEY, n int NOT NULL)`,
		`INSERT INTO churn SELECT i, 0 FROM generate_series(1, 100) AS i`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if _, err := conn.Exec(ctx, `UPDATE churn SET n = n + 1`); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction passing by may hold the rows a moment: they count
	// once they stayed for a while.
	dead := 0
	testenv.Holds(800*time.Millisecond, func() bool {
		notices = nil
		if _, err := conn.Exec(ctx, `VACUUM (VERBOSE) churn`); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(notices, "\n")
		m := notRemovableRE.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("VACUUM VERBOSE did not report dead rows:\n%s", text)
		}
		dead, _ = strconv.Atoi(m[1])
		return dead != 0
	})
	return dead
}
