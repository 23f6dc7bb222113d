package taskrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/jackc/pgx/v5/pgconn"
)

// While the database is away, reported events wait within the bounds and
// the reader then waits too: nothing is dropped. Progress and checkpoints
// never wait: the newest replaces the one waiting.
func TestPendingEventsAreBoundedByWaitingNotDropping(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	ctx := context.Background()
	for i := range maxPendingEvents {
		if err := w.report(ctx, "ROWS", json.RawMessage(strconv.Itoa(i)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
	// One more named event waits for room, here until its context ends.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := w.report(wctx, "ROWS", json.RawMessage(`"over"`), nil, false, etlcontext.Replaced{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a named event past the bound: %v, want it to wait", err)
	}
	// Children wait too.
	if err := w.submitChild(wctx, protocol.Child{Kind: "c"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a child past the bound: %v, want it to wait", err)
	}
	// Progress and checkpoints do not: each replaces the one waiting.
	for n := range 5 {
		for _, suffix := range []string{protocol.EventProgress, protocol.EventCheckpoint} {
			if err := w.report(ctx, suffix, json.RawMessage(strconv.Itoa(n)), nil, false, etlcontext.Replaced{}); err != nil {
				t.Fatalf("%s past the bound: %v", suffix, err)
			}
		}
	}
	// The runner's own events are never refused.
	w.outcome(protocol.EventFinal, protocol.Outcome{ExitCode: new(0)}, protocol.Outcome{})

	var live []*pendingEvent
	for _, e := range w.events {
		if !e.gone {
			live = append(live, e)
		}
	}
	if len(live) != maxPendingEvents+3 {
		t.Fatalf("%d events wait, want %d named ones, the newest progress and checkpoint, and FINAL", len(live), maxPendingEvents)
	}
	tail := live[maxPendingEvents:]
	for i, want := range []string{"k:PROGRESS 4", "k:CHECKPOINT 4", "k:FINAL"} {
		got := tail[i].ev.Type
		if p, ok := tail[i].ev.Payload.(json.RawMessage); ok && tail[i].ev.Type != "k:FINAL" {
			got += " " + string(p)
		}
		if got != want {
			t.Errorf("waiting event %d: %s, want %s", maxPendingEvents+i, got, want)
		}
	}
	// Numbered when first written: replaced events use up no number.
	for i, e := range w.events {
		if e.ev.Seq != nil {
			t.Fatalf("event %d (%s) was numbered before it was written", i, e.ev.Type)
		}
	}
}

// What the database would refuse is replaced, and one WARNING stands for
// every replacement while it waits.
func TestReplacementsAreCleanedAndNotedOnce(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	ctx := context.Background()
	for range 3 {
		rep := decodeLine([]byte("{\"type\":\"rows\",\"payload\":\"a\\u0000b\xff\"}"))
		if err := w.report(ctx, rep.suffix, rep.payload, rep.meta, rep.isError, rep.replaced); err != nil {
			t.Fatal(err)
		}
	}
	w.event(protocol.EventWarning, map[string]any{"reason": "nul\x00"}, nil, false)
	var warnings []*pendingEvent
	for _, e := range w.events {
		if p, ok := e.ev.Payload.(json.RawMessage); ok && e.ev.Type == "k:ROWS" && string(p) != `"a\ufffdb\ufffd"` {
			t.Errorf("payload %s, want it cleaned", p)
		}
		if e.replaced != nil {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 1 {
		t.Fatalf("%d replacement warnings, want 1", len(warnings))
	}
	n := warnings[0].replaced
	if n.lines != 4 || n.replaced != (etlcontext.Replaced{NUL: 4, InvalidUTF8: 3}) {
		t.Errorf("noted %d lines, %+v; want 4 lines, 4 NUL, 3 invalid UTF-8", n.lines, n.replaced)
	}
}

// Progress reported without end while the head of the queue waits (the
// database away) keeps the queue at its bound: replaced events leave it.
func TestCoalescedEventsDoNotGrowTheQueue(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	ctx := context.Background()
	for i := range maxPendingEvents {
		if err := w.report(ctx, "ROWS", json.RawMessage(strconv.Itoa(i)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100000 {
		if err := w.report(ctx, protocol.EventProgress, json.RawMessage(strconv.Itoa(i)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(w.events); n > 2*maxPendingEvents {
		t.Errorf("%d events in the queue after 100,000 coalesced progress lines, want at most %d", n, 2*maxPendingEvents)
	}
}

// Progress and checkpoints are sampled: the first of each is queued at
// once, those that follow within the interval wait, each replacing the
// last, and the newest is queued when the interval is up, or before the
// outcome. Named events are never held, and a checkpoint held is queued
// before a named event that follows it.
func TestProgressAndCheckpointsAreSampled(t *testing.T) {
	queued := func(w *writer) []string {
		w.mu.Lock()
		defer w.mu.Unlock()
		var got []string
		for _, e := range w.events {
			if !e.gone {
				p, _ := e.ev.Payload.(json.RawMessage)
				got = append(got, e.ev.Type+" "+string(p))
			}
		}
		return got
	}
	report := func(w *writer, suffix string, n int) {
		t.Helper()
		if err := w.report(context.Background(), suffix, json.RawMessage(strconv.Itoa(n)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("before the outcome", func(t *testing.T) {
		w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
		w.sampleEvery = time.Hour
		w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
		for i := range 100 {
			report(w, protocol.EventProgress, i)
			report(w, protocol.EventCheckpoint, i)
			if i%50 == 0 {
				report(w, "ROWS", i)
			}
		}
		w.mu.Lock()
		newest := string(w.progress.payload)
		w.mu.Unlock()
		if newest != "99" {
			t.Errorf("progress for the context %q, want the newest, 99", newest)
		}
		w.outcome(protocol.EventFinal, protocol.Outcome{ExitCode: new(0)}, protocol.Outcome{})
		got := strings.Join(queued(w), ", ")
		want := `k:PROGRESS 0, k:CHECKPOINT 0, k:ROWS 0, k:CHECKPOINT 50, k:ROWS 50, k:PROGRESS 99, k:CHECKPOINT 99, k:FINAL {"exit_code":0}`
		if got != want {
			t.Errorf("queued:\n%s\nwant:\n%s", got, want)
		}
	})

	t.Run("when the interval is up", func(t *testing.T) {
		w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
		// Long enough for the 100 reports to come within it.
		w.sampleEvery = time.Second
		w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
		for i := range 100 {
			report(w, protocol.EventCheckpoint, i)
		}
		testenv.Eventually(t, 10*time.Second, "the newest checkpoint queued", func() (bool, error) {
			got := queued(w)
			return slices.Equal(got, []string{"k:CHECKPOINT 0", "k:CHECKPOINT 99"}), fmt.Errorf("queued %v", got)
		})
	})
}

// At the bounds a checkpoint replaces the one waiting, but not across an
// event queued between them: what came after a checkpoint is never stored
// before every checkpoint that preceded it.
func TestACheckpointIsNotReplacedAcrossAnEvent(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	ctx := context.Background()
	for i := range maxPendingEvents {
		if err := w.report(ctx, "ROWS", json.RawMessage(strconv.Itoa(i)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func(n int) {
		t.Helper()
		if err := w.report(ctx, protocol.EventCheckpoint, json.RawMessage(strconv.Itoa(n)), nil, false, etlcontext.Replaced{}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint(1)
	// The runner's own events never wait for room.
	w.event(protocol.EventWarning, map[string]any{"reason": "between"}, nil, false)
	checkpoint(2)
	checkpoint(3)
	var got []string
	for _, e := range w.events[maxPendingEvents:] {
		if !e.gone {
			p, _ := e.ev.Payload.(json.RawMessage)
			got = append(got, e.ev.Type+" "+string(p))
		}
	}
	want := []string{"k:CHECKPOINT 1", `k:WARNING {"reason":"between"}`, "k:CHECKPOINT 3"}
	if !slices.Equal(got, want) {
		t.Errorf("queued after the named events: %q, want %q", got, want)
	}
}

// A parent's writer passes on the end announcements of its own children,
// and those standing for missed ones, but none of other contexts: a flood
// of them cannot fill the buffer a child's end must find room in.
func TestOnlyAChildsEndReachesItsParent(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(7, "00000000-0000-0000-0000-000000000001", "k")
	for i := range 10 * cap(w.notify) {
		w.hear(&pgconn.Notification{Channel: etlcontext.FinishedChannel, Payload: fmt.Sprintf(`{"etl_context_id": %d, "parent_context_id": 8}`, i)})
		w.hear(&pgconn.Notification{Channel: etlcontext.FinishedChannel, Payload: fmt.Sprintf(`{"etl_context_id": %d}`, i)})
	}
	if n := len(w.notify); n != 0 {
		t.Fatalf("%d announcements of other contexts' ends passed on, want none", n)
	}
	child := `{"etl_context_id": 9, "parent_context_id": 7}`
	for _, payload := range []string{child, ""} {
		w.hear(&pgconn.Notification{Channel: etlcontext.FinishedChannel, Payload: payload})
		select {
		case n := <-w.notify:
			if n.Payload != payload {
				t.Fatalf("passed on %q, want %q", n.Payload, payload)
			}
		default:
			t.Fatalf("the announcement %q was not passed on", payload)
		}
	}
}
