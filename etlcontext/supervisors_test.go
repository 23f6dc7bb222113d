package etlcontext_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A due task says that no supervisor serves it only when none does: not
// while one serves its kind in its queue, nor while one of a release that
// does not say what it serves holds its liveness lock; one that serves its
// kind in another queue is named so; one not seen for 90 s, its session
// alive, is UNRESPONSIVE and serves nothing.
func TestWhoServesADueTask(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3) // kind k, queue q
	reason := func() string {
		tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		troubles, err := etlcontext.Troubles(ctx, env.Pool, []int64{id})
		if err != nil {
			t.Fatal(err)
		}
		return etlcontext.ReasonOf(tasks[0], troubles[id], time.Now()).Format(time.Now(), func(at time.Time) string { return at.String() })
	}
	// live holds a supervisor's liveness lock, as its connection does, in
	// a session named as its is, until the test ends it.
	live := func(url, client string) (end func()) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = "dama-supervisor-liveness:" + client
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, etlcontext.ClientLockNamespace, client); err != nil {
			t.Fatal(err)
		}
		end = func() {
			var ended bool
			if err := env.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, conn.PgConn().PID()).Scan(&ended); err != nil || !ended {
				t.Fatalf("end the session of %s: %v %v", client, ended, err)
			}
			conn.Close(ctx)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return end
	}
	serves := func(client string, queues ...string) {
		err := etlcontext.SupervisorServes(ctx, env.Pool, etlcontext.Supervisor{
			ClientID: client, Host: "h-" + client, HostID: new("boot/ns"), PID: new(1), Release: new("v"),
			LockModes: []string{"row"}, Queues: queues, Kinds: []string{"k"}, PodKinds: []string{},
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	if got, want := reason(), "waiting: no supervisor serves kind k"; got != want {
		t.Errorf("none ever served: %q, want %q", got, want)
	}
	endOther := live(env.URL, "other_2026_12_07T10_00_00_000000")
	serves("other_2026_12_07T10_00_00_000000", "elsewhere")
	if got, want := reason(), "waiting: no supervisor serves kind k in queue q"; got != want {
		t.Errorf("one serves k in another queue: %q, want %q", got, want)
	}
	endOther()
	if got := reason(); got != "waiting: no supervisor serves kind k (last seen 0s ago on h-other_2026_12_07T10_00_00_000000)" {
		t.Errorf("the one that served k is gone: %q, want it named", got)
	}

	// A reader's (or a task's) login may take any advisory lock, but does
	// not make the gone supervisor SERVING.
	endForged := live(env.NewLogin("dama_reader"), "other_2026_12_07T10_00_00_000000")
	if got := reason(); !strings.HasPrefix(got, "waiting: no supervisor serves kind k (last seen") {
		t.Errorf("a reader holds the lock of the gone supervisor: %q, want still none serving", got)
	}
	endForged()

	endEarlier := live(env.URL, "old-host_2026_12_07T09_00_00_000000")
	if got := reason(); got != "-" {
		t.Errorf("a supervisor of an earlier release serves: %q, want nothing said", got)
	}
	sups, err := etlcontext.Supervisors(ctx, env.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if s := sups[0]; s.State != etlcontext.SupervisorServing || s.Host != "old-host" || s.Release != nil || s.Kinds != nil {
		t.Errorf("the earlier release's supervisor: %+v, want SERVING on old-host, what it serves unknown", s)
	}
	endEarlier()

	live(env.URL, "this_2026_12_07T11_00_00_000000")
	serves("this_2026_12_07T11_00_00_000000", "q")
	if got := reason(); got != "-" {
		t.Errorf("one serves k in q: %q, want nothing said", got)
	}
	// It replaced the one of its host that no longer serves.
	sups, err = etlcontext.Supervisors(ctx, env.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(sups) != 1 {
		t.Errorf("supervisors once one of the host serves again: %+v, want it alone", sups)
	}
	if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.supervisors SET last_seen_at = now() - interval '91 seconds' WHERE client_id LIKE 'this%'`); err != nil {
		t.Fatal(err)
	}
	sups, err = etlcontext.Supervisors(ctx, env.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(sups[0].State, " ", sups[0].Host); got != "UNRESPONSIVE h-this_2026_12_07T11_00_00_000000" {
		t.Errorf("one not seen for 91 s, its session alive: %s, want UNRESPONSIVE", got)
	}
	if got := reason(); !strings.HasPrefix(got, "waiting: no supervisor serves kind k (last seen ") {
		t.Errorf("its only supervisor unresponsive: %q", got)
	}
}
