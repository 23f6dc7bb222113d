package taskrunner

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A child is created in the transaction of its SUBMITTED event, which the
// database fences: a run that is no longer current creates none. A child
// refused for good is recorded as a WARNING in its place.
func TestAChildIsSubmittedOnlyByTheCurrentRun(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	// Whose tasks may submit children of kind c (migration 33).
	if _, err := etlcontext.PublishKinds(ctx, env.Pool, []etlcontext.PublishedKind{{Kind: "k", Queue: "q", MaxAttempts: 3, Children: []string{"c"}, PublishedBy: "test", Release: "test"}}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := env.Pool.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('k', 'q', 3)
		RETURNING etl_context_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:INITIAL", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	startRun := func() string {
		var run string
		if err := env.Pool.QueryRow(ctx, `
			UPDATE data_manager.etl_contexts SET etl_status = 'RUNNING', attempt = attempt + 1, run_id = gen_random_uuid()
			 WHERE etl_context_id = $1 RETURNING run_id::text`, id).Scan(&run); err != nil {
			t.Fatal(err)
		}
		return run
	}
	stale := startRun()
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:ERROR", RunID: &stale, Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	current := startRun()
	insertChild := func(ctx context.Context, tx pgx.Tx, c protocol.Child) (int64, bool, error) {
		var child int64
		err := tx.QueryRow(ctx, `
			INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts, idempotency_key)
			VALUES ($1, $2, 'q', 1, $3) RETURNING etl_context_id`, c.ParentID, c.Kind, c.IdempotencyKey).Scan(&child)
		return child, true, err
	}
	refuse := func(context.Context, pgx.Tx, protocol.Child) (int64, bool, error) {
		return 0, false, errors.New(`unknown kind "nope"`)
	}
	// One writer per submission; a run's writer numbers its writes, so
	// each starts past the previous one's.
	seq := 0
	submit := func(run string, fn SubmitFunc) error {
		w := newWriter(env.URL, "dama-test", slog.New(slog.DiscardHandler), 5*time.Second, writerHooks{})
		w.submit = fn
		w.nextSeq, seq = seq, seq+1
		w.bind(id, run, "k")
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.run(wctx, nil, protocol.CancelChannel)
		}()
		defer func() {
			stop()
			<-done
		}()
		if err := w.submitChild(ctx, protocol.Child{Kind: "c", Args: []byte(`{}`)}); err != nil {
			return err
		}
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return w.flush(fctx)
	}
	children := func() int {
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE parent_context_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	if err := submit(stale, insertChild); !errors.Is(err, etlcontext.ErrStaleRun) {
		t.Errorf("submission from the previous run: %v, want ErrStaleRun", err)
	}
	if n := children(); n != 0 {
		t.Fatalf("the previous run created %d children, want none", n)
	}
	if err := submit(current, insertChild); err != nil {
		t.Fatalf("submission from the current run: %v", err)
	}
	if err := submit(current, refuse); err != nil {
		t.Fatalf("refused submission: %v", err)
	}
	if n := children(); n != 1 {
		t.Fatalf("%d children, want 1", n)
	}
	evs, err := etlcontext.Events(ctx, env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
		if e.Type == "k:WARNING" && !strings.Contains(string(e.Meta), `unknown kind \"nope\"`) {
			t.Errorf("WARNING meta %s, want the refusal", e.Meta)
		}
	}
	if strings.Join(types, " ") != "k:INITIAL k:ERROR k:SUBMITTED k:WARNING" {
		t.Errorf("events %v, want INITIAL, ERROR, SUBMITTED, WARNING", types)
	}
}
