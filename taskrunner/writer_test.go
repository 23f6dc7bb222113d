package taskrunner

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
)

func TestPendingEventsAreBoundedAndKeepTheNewestCheckpoint(t *testing.T) {
	w := newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})
	w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	// The database is away: nothing is written while events pile up.
	for i := range maxPendingEvents {
		w.event(etlcontext.EventProgress, json.RawMessage(`{}`), nil, false, 10)
		if i == 10 {
			w.event(etlcontext.EventCheckpoint, json.RawMessage(`{"n":0}`), nil, false, 10)
		}
	}
	for n := 1; n <= 3; n++ {
		w.event(etlcontext.EventProgress, json.RawMessage(`{}`), nil, false, 10)
		w.event(etlcontext.EventCheckpoint, json.RawMessage(`{"n":`+string(rune('0'+n))+`}`), nil, false, 10)
	}
	if got := len(w.events); got != maxPendingEvents+1 {
		t.Fatalf("%d events pending, want the bound %d plus the newest checkpoint", got, maxPendingEvents)
	}
	last := w.events[len(w.events)-1].ev
	if last.Type != "k:CHECKPOINT" || string(last.Payload.(json.RawMessage)) != `{"n":3}` {
		t.Errorf("the last pending event is %s %v, want the newest checkpoint", last.Type, last.Payload)
	}
	if cp := w.events[11].ev; cp.Type != "k:CHECKPOINT" {
		t.Errorf("the checkpoint reported within the bound was not kept: %s", cp.Type)
	}
	// Beyond the bound: the fill's last progress event, 3 more, and the 2
	// checkpoints superseded by a newer one.
	if w.dropped != 6 {
		t.Errorf("%d events counted as dropped, want 6", w.dropped)
	}
	// Sequence numbers still increase in queue order.
	for i := 1; i < len(w.events); i++ {
		if *w.events[i].ev.Seq <= *w.events[i-1].ev.Seq {
			t.Fatalf("event %d has seq %d after %d", i, *w.events[i].ev.Seq, *w.events[i-1].ev.Seq)
		}
	}
}
