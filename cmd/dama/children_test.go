package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
)

// A command submits only the kinds its kind names in children:.
// Reproduced before the guard: a kind under another user wrote a submit
// line for a kind under root, with the arguments it chose, and root ran
// it. Now its task process refuses it in a WARNING and goes on; and the
// database refuses any task made under a parent whose kind does not name
// its kind, however it is inserted and by whom: dama submit --parent, an
// operator's INSERT, the owner's.
func TestACommandSubmitsOnlyItsKindsChildren(t *testing.T) {
	t.Parallel()
	ensureUser(t, commandUser)
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 200ms
kinds:
  low:
    user: ` + commandUser + `
    children: [piece]
    await_children: true
    command: ["/bin/sh", "-c", "printf '{\"type\":\"submit\",\"payload\":{\"kind\":\"high\",\"args\":{\"as\":\"root\"}}}\n{\"type\":\"submit\",\"payload\":{\"kind\":\"piece\"}}\n' >&3"]
  high:
    user: root
    command: ["/usr/bin/id"]
  piece:
    user: ` + commandUser + `
    command: ["/bin/true"]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("low")
	// The refused child counts as one that could not be submitted: a
	// parent awaiting its children fails for good.
	if got := w.waitFinished(id, time.Minute); got.Status != etlcontext.StatusFailed {
		t.Errorf("the parent: %s, want FAILED, one of its children refused", got.Status)
	}
	if kids := w.children(id); len(kids) != 1 || kids[0].Kind != "piece" {
		t.Errorf("the parent's children: %v, want one, of kind piece", kids)
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	const refusal = "kind low may not submit kind high: its children: are [piece]"
	warned := false
	for _, e := range events {
		warned = warned || e.Type == "low:WARNING" && strings.Contains(string(e.Meta), refusal)
	}
	if !warned {
		t.Errorf("no low:WARNING saying %q: %v", refusal, w.eventTypes(id))
	}

	// The database's own check, whoever writes.
	res := w.DamaWith(cfg, []string{"DATABASE_URL=" + env.NewLogin(sql.RoleOperator)}, "submit", "high", "--parent", fmt.Sprint(id))
	const dbRefusal = "kind low may not submit kind high"
	if lines := strings.Split(strings.TrimSpace(res.Stderr), "\n"); res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], dbRefusal) {
		t.Errorf("dama submit high --parent %d as an operator: exit %d, %q; want one line saying %q", id, res.Code, res.Stderr, dbRefusal)
	}
	ctx := context.Background()
	op, err := pgx.Connect(ctx, env.NewLogin(sql.RoleOperator))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close(ctx)
	insert := `INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts) VALUES ($1, 'high', 'default', 1)`
	for who, exec := range map[string]func() error{
		"an operator's INSERT": func() error { _, err := op.Exec(ctx, insert, id); return err },
		"the owner's INSERT":   func() error { _, err := w.Pool.Exec(ctx, insert, id); return err },
	} {
		if err := exec(); err == nil || !strings.Contains(err.Error(), dbRefusal) {
			t.Errorf("%s of a high task under task %d: %v; want %q", who, id, err, dbRefusal)
		}
	}
	// A kind an earlier release published names no children (NULL): its
	// tasks submit as before, until a supervisor of this release
	// publishes it, so that an upgrade fails no tree on its way.
	if _, err := w.Pool.Exec(ctx, `INSERT INTO data_manager.kinds (kind, queue, max_attempts, published_by, release) VALUES ('legacy', 'default', 1, 'test', 'v0.1.0')`); err != nil {
		t.Fatal(err)
	}
	legacy, _, err := etlcontext.CreateTask(ctx, w.Pool, etlcontext.NewTask{Kind: "legacy", Queue: "default", MaxAttempts: 1})
	if err == nil {
		_, _, err = etlcontext.CreateTask(ctx, w.Pool, etlcontext.NewTask{Kind: "piece", Queue: "default", MaxAttempts: 1, ParentID: legacy})
	}
	if err != nil {
		t.Errorf("a child under a kind an earlier release published: %v, want it made", err)
	}
	var highs int
	if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE kind = 'high'`).Scan(&highs); err != nil || highs != 0 {
		t.Errorf("%d tasks of kind high (%v), want none", highs, err)
	}
}
