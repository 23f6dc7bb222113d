package taskrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// runningContext makes a context of kind k whose run is current, and
// returns its id and run.
func runningContext(t *testing.T, env *testenv.Env) (int64, string) {
	t.Helper()
	var (
		id  int64
		run string
	)
	ctx := context.Background()
	if err := env.Pool.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('k', 'q', 3)
		RETURNING etl_context_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:INITIAL", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Pool.QueryRow(ctx, `
		UPDATE data_manager.etl_contexts SET etl_status = 'RUNNING', attempt = 1, run_id = gen_random_uuid()
		 WHERE etl_context_id = $1 RETURNING run_id::text`, id).Scan(&run); err != nil {
		t.Fatal(err)
	}
	return id, run
}

// writeAll queues n ROWS events, payload(i) each, on a writer for the run
// connected to dbURL, all before the writer starts, so that they go in as
// few statements as it allows, and waits until they are written.
func writeAll(t *testing.T, dbURL string, id int64, run string, n int, payload func(i int) string) {
	t.Helper()
	ctx := context.Background()
	w := newWriter(dbURL, "dama-test", slog.New(slog.DiscardHandler), stmtTimeout, writerHooks{})
	w.bind(id, run, "k")
	for i := range n {
		if err := w.report(ctx, "ROWS", json.RawMessage(payload(i)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
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
	// A bound, not a guess: a batch tried again whole forever never ends.
	fctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := w.flush(fctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// storedRows returns the ROWS and WARNING events of context id, in order.
func storedRows(t *testing.T, env *testenv.Env, id int64) []string {
	t.Helper()
	evs, err := etlcontext.Events(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		switch e.Type {
		case "k:ROWS":
			out = append(out, string(e.Payload))
		case "k:WARNING":
			out = append(out, "WARNING")
		}
	}
	return out
}

// A batch the server cuts short (here by its statement_timeout, 300 ms,
// while each row takes 10 ms to store) is written in smaller batches, not
// tried again whole forever. The server cuts it, not the writer's own
// deadline, so that the connection survives: on a busy machine a new one
// can take longer than 300 ms to make, which would test the machine.
func TestABatchCutShortIsWrittenSmaller(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if _, err := env.Pool.Exec(context.Background(), `
		CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
		CREATE TRIGGER slow_row BEFORE INSERT ON data_manager.event_store
		   FOR EACH ROW WHEN (NEW.type = 'k:ROWS') EXECUTE FUNCTION slow_row()`); err != nil {
		t.Fatal(err)
	}
	id, run := runningContext(t, env)
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("statement_timeout", "300") // a run-time parameter to pgx
	u.RawQuery = q.Encode()
	writeAll(t, u.String(), id, run, 100, func(i int) string { return fmt.Sprint(i) })
	got := storedRows(t, env, id)
	if len(got) != 100 || got[0] != "0" || got[99] != "99" {
		t.Errorf("stored %d ROWS events (%v), want all 100, in order", len(got), got)
	}
}

// One event the database refuses in a batch costs that event alone: a
// WARNING stands in for it, and the events around it are stored.
func TestOneRefusedEventCostsNoOther(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if _, err := env.Pool.Exec(context.Background(), `
		ALTER TABLE data_manager.event_store ADD CONSTRAINT no_poison CHECK (NOT payload ? 'poison')`); err != nil {
		t.Fatal(err)
	}
	id, run := runningContext(t, env)
	writeAll(t, env.URL, id, run, 10, func(i int) string {
		if i == 6 {
			return `{"poison": 1}`
		}
		return fmt.Sprint(i)
	})
	got := strings.Join(storedRows(t, env, id), " ")
	if want := "0 1 2 3 4 5 WARNING 7 8 9"; got != want {
		t.Errorf("stored %s, want %s", got, want)
	}
}

// The outcome goes in one statement with the log's last chunk. When the
// database refuses that statement for good, only what it refused is given
// up: the outcome's details when the events were at fault (the chunk goes
// with the plain outcome), the chunk when it was (the detailed outcome is
// stored, the log file keeps the chunk).
func TestARefusedOutcomeCostsTheTailOnlyWhenTheTailIsAtFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		at, refuse, wantTail, wantOutcome string
	}{
		{"events", `ALTER TABLE data_manager.event_store ADD CHECK (payload->>'reason' IS DISTINCT FROM 'poison')`, "poison\n", `{}`},
		{"tail", `ALTER TABLE data_manager.log_chunks ADD CHECK (position('poison'::bytea IN data) = 0)`, "", `{"reason": "poison"}`},
	} {
		t.Run(tc.at, func(t *testing.T) {
			t.Parallel()
			env := testenv.New(t)
			ctx := context.Background()
			if _, err := env.Pool.Exec(ctx, tc.refuse); err != nil {
				t.Fatal(err)
			}
			id, run := runningContext(t, env)
			f, err := os.CreateTemp(t.TempDir(), "log")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString("poison\n"); err != nil {
				t.Fatal(err)
			}
			w := newWriter(env.URL, "dama-test", slog.New(slog.DiscardHandler), stmtTimeout, writerHooks{})
			w.bind(id, run, "k")
			w.keepTail(&logTail{f: f, keep: 1 << 20, every: time.Hour})
			w.flushTail(ctx)
			w.outcome(protocol.EventFinal, protocol.Outcome{Reason: "poison"}, protocol.Outcome{})
			wctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.run(wctx, nil, protocol.CancelChannel)
			}()
			defer func() {
				stop()
				<-done
				w.tail.Load().close()
			}()
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := w.flush(fctx); err != nil {
				t.Fatalf("flush: %v", err)
			}
			var outcome string
			if err := env.Pool.QueryRow(ctx, `
				SELECT payload::text FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'k:FINAL'`, id).Scan(&outcome); err != nil {
				t.Fatalf("read the outcome: %v", err)
			}
			pieces, err := etlcontext.LogSince(ctx, env.Pool, id, etlcontext.LogPos{}, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			var tail string
			for _, p := range pieces {
				tail += string(p.Data)
			}
			if outcome != tc.wantOutcome || tail != tc.wantTail {
				t.Errorf("stored the outcome %s and the tail %q; want %s and %q", outcome, tail, tc.wantOutcome, tc.wantTail)
			}
		})
	}
}
