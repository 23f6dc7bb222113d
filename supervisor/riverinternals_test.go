package supervisor

import (
	"context"
	"encoding/json"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/internal/testenv"
)

// TestRiverIsTheVersionChecked fails when River is upgraded: the internals
// riverinternals.go lists were checked against riverChecked, and must be
// checked again before it moves. The version is read from where River's
// code was built from (a module path ends in @version, with -trimpath or
// without), for a test binary carries no list of its dependencies.
func TestRiverIsTheVersionChecked(t *testing.T) {
	t.Parallel()
	for name, fn := range map[string]any{
		"river":       river.NewClient[pgx.Tx],
		"riverpgxv5":  riverpgxv5.New,
		"riverdriver": riverdriver.JobSetStateCompleted,
	} {
		file, _ := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).FileLine(reflect.ValueOf(fn).Pointer())
		if !strings.Contains(file, "@"+riverChecked+"/") {
			t.Errorf("%s is built from %s; the River internals dama relies on (riverinternals.go) were checked against %s: check them again, then move riverChecked", name, file, riverChecked)
		}
	}
}

// TestCreateTaskInsertsTheJobRiverWould: data_manager.create_task, the one
// path by which tasks are made, from any language, inserts the job that
// River's own InsertTx inserts for the same TaskArgs, column by column (but
// for its id, its times and the context it names), and sends the insert
// notification River's producers listen to with the same payload, as
// River's insert-only clients for other languages are kept in step with
// River.
func TestCreateTaskInsertsTheJobRiverWould(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	listener, err := pgx.Connect(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(ctx, `LISTEN "public.river_insert"`); err != nil {
		t.Fatal(err)
	}
	notified := func() map[string]any {
		t.Helper()
		n, err := listener.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("wait for River's insert notification: %v", err)
		}
		var payload map[string]any
		if err := json.Unmarshal([]byte(n.Payload), &payload); err != nil {
			t.Fatalf("insert notification %q: %v", n.Payload, err)
		}
		return payload
	}
	// row is the job of context id as create_task or InsertTx left it, but
	// for what differs between any two jobs.
	row := func(job int64) map[string]any {
		t.Helper()
		var r map[string]any
		if err := env.Pool.QueryRow(ctx, `
			SELECT to_jsonb(j) - 'id' - 'created_at' - 'scheduled_at'
			       || jsonb_build_object('args', j.args - 'etl_context_id',
			                             'due_at_insert', j.scheduled_at <= now())
			  FROM river_job AS j WHERE j.id = $1`, job).Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}

	var id, sqlJob int64
	if err := env.Pool.QueryRow(ctx, `
		SELECT etl_context_id FROM data_manager.create_task('extract', '{"table": "t"}', NULL, 'etl', 7, NULL, NULL, NULL)`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := env.Pool.QueryRow(ctx, `SELECT river_job_id FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&sqlJob); err != nil {
		t.Fatal(err)
	}
	fromSQL, sqlNote := row(sqlJob), notified()

	rc, err := river.NewClient(riverpgxv5.New(env.Pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var goJob int64
	if err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		res, err := rc.InsertTx(ctx, tx, TaskArgs{ETLContextID: id, TaskKind: "extract"}, &river.InsertOpts{Queue: "etl", MaxAttempts: 7})
		if err == nil {
			goJob = res.Job.ID
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	fromGo, goNote := row(goJob), notified()

	if !reflect.DeepEqual(fromSQL, fromGo) {
		t.Errorf("create_task's job differs from InsertTx's:\n create_task: %v\n    InsertTx: %v", fromSQL, fromGo)
	}
	if !reflect.DeepEqual(sqlNote, goNote) {
		t.Errorf("create_task's insert notification %v, InsertTx's %v", sqlNote, goNote)
	}
}
