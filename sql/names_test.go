package sql_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// TestTheDatabaseSpellsNamesAsGoDoes checks the names the schema spells
// out (in its constraints, view and triggers, written by migrations that
// never change) against etlcontext, where Go defines each of them once: a
// status, a reason to wait or a lock namespace renamed on one side only
// fails here rather than in a task.
func TestTheDatabaseSpellsNamesAsGoDoes(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	quoted := regexp.MustCompile(`'([^']*)'::text`)
	constraintValues := func(name string) []string {
		t.Helper()
		var def string
		if err := env.Pool.QueryRow(ctx, `
			SELECT pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
			 WHERE conname = $1 AND connamespace = 'data_manager'::regnamespace`, name).Scan(&def); err != nil {
			t.Fatalf("read constraint %s: %v", name, err)
		}
		var values []string
		for _, m := range quoted.FindAllStringSubmatch(def, -1) {
			values = append(values, m[1])
		}
		slices.Sort(values)
		return values
	}

	var statuses, finished []string
	for _, s := range etlcontext.Statuses {
		statuses = append(statuses, string(s))
		if s.Finished() {
			finished = append(finished, string(s))
		}
	}
	slices.Sort(statuses)
	slices.Sort(finished)
	if got := constraintValues("etl_contexts_etl_status_check"); !slices.Equal(got, statuses) {
		t.Errorf("etl_contexts.etl_status takes %v, etlcontext.Statuses are %v", got, statuses)
	}
	if got := constraintValues("etl_attempts_outcome_check"); !slices.Equal(got, finished) {
		t.Errorf("etl_attempts.outcome takes %v, the finished statuses are %v", got, finished)
	}
	waits := []string{string(etlcontext.WaitQueuePaused), string(etlcontext.WaitKindBlocked),
		string(etlcontext.WaitQueueFull), string(etlcontext.WaitKindFull), string(etlcontext.WaitKeyFull), string(etlcontext.WaitSessions)}
	slices.Sort(waits)
	if got := constraintValues("etl_contexts_waiting_for_check"); !slices.Equal(got, waits) {
		t.Errorf("etl_contexts.waiting_for takes %v, etlcontext's Waits are %v", got, waits)
	}

	// The view finds a running task by its lock.
	var view string
	if err := env.Pool.QueryRow(ctx, `SELECT pg_get_viewdef('data_manager.dama_task_queue'::regclass)`).Scan(&view); err != nil {
		t.Fatal(err)
	}
	namespaces := regexp.MustCompile(`classid = \(?(\d+)\)?::oid`).FindAllStringSubmatch(view, -1)
	if len(namespaces) == 0 {
		t.Fatalf("the view reads no advisory lock:\n%s", view)
	}
	for _, m := range namespaces {
		if m[1] != strconv.Itoa(protocol.LockNamespace) {
			t.Errorf("the view reads locks of namespace %s, protocol.LockNamespace is %d", m[1], protocol.LockNamespace)
		}
	}

	// The events the triggers act on are dama's.
	suffixes := []string{protocol.EventInitial, protocol.EventFinal, protocol.EventError,
		protocol.EventCancelled, protocol.EventProgress, protocol.EventCheckpoint,
		protocol.EventWarning, protocol.EventTimeout, protocol.EventRetried,
		protocol.EventSubmitted, protocol.EventCancelRequested, protocol.EventAwaiting}
	var bodies []string
	rows, err := env.Pool.Query(ctx, `SELECT prosrc FROM pg_catalog.pg_proc WHERE pronamespace = 'data_manager'::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`'%:([A-Z_]+)'|':([A-Z_]+)'|suffix = '([A-Z_]+)'`)
	found := 0
	for _, b := range bodies {
		for _, m := range named.FindAllStringSubmatch(b, -1) {
			s := m[1] + m[2] + m[3]
			found++
			if !slices.Contains(suffixes, s) {
				t.Errorf("a trigger names the event suffix %s, which etlcontext does not define", s)
			}
		}
	}
	if found == 0 {
		t.Error("no trigger names an event suffix: the check looks for the wrong spelling")
	}
}
