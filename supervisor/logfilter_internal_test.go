package supervisor

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a buffer that the timers' goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logger logs the records of "held..." messages through o held for grace,
// the others at once, as text without times.
func logger(o *outageMuter, grace time.Duration) (*slog.Logger, *syncBuffer) {
	out := &syncBuffer{}
	text := slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	return slog.New(o.Handler(text, grace, func(r slog.Record) bool { return strings.HasPrefix(r.Message, "held") })), out
}

// A held warning waits for its grace, and is written after it unless an
// outage began meanwhile; Flush waits for it, so that none is lost at
// exit. During an outage warnings are muted and counted, other records
// pass.
func TestOutageHoldsMutesAndFlushes(t *testing.T) {
	t.Parallel()
	t.Run("held until the grace ends", func(t *testing.T) {
		t.Parallel()
		var o outageMuter
		log, out := logger(&o, time.Hour)
		log.Warn("held for an hour")
		log.Warn("not held")
		if got := out.String(); got != "level=WARN msg=\"not held\"\n" {
			t.Errorf("%q, want the warning that is not held alone", got)
		}
		o.Begin() // the held one is dropped, in an hour
	})
	t.Run("flushed", func(t *testing.T) {
		t.Parallel()
		var o outageMuter
		log, out := logger(&o, 10*time.Millisecond)
		log.Warn("held, then written")
		o.Flush()
		if got := out.String(); got != "level=WARN msg=\"held, then written\"\n" {
			t.Errorf("after Flush: %q, want the held warning", got)
		}
	})
	t.Run("dropped for an outage", func(t *testing.T) {
		t.Parallel()
		var o outageMuter
		// Its grace is the time between the warning and Begin, on a busy
		// machine too.
		log, out := logger(&o, 2*time.Second)
		log.Warn("held, then dropped")
		o.Begin()
		log.Error("during the outage")
		log.Info("an info passes")
		o.Flush()
		if muted := o.End(); muted != 2 {
			t.Errorf("%d records muted, want the held one and the one during the outage", muted)
		}
		if got := out.String(); got != "level=INFO msg=\"an info passes\"\n" {
			t.Errorf("around an outage: %q, want the info alone", got)
		}
	})
	// A warning logged at the very instant an outage begins (the listening
	// connection's, in the same millisecond as the liveness connection's
	// error) is muted: here the outage begins while the warning is being
	// handled, between its look at the outage and its being held.
	t.Run("dropped when the outage begins as it is handled", func(t *testing.T) {
		t.Parallel()
		var o outageMuter
		out := &syncBuffer{}
		log := slog.New(o.Handler(slog.NewTextHandler(out, nil), 10*time.Millisecond, func(slog.Record) bool {
			o.Begin()
			return true
		}))
		log.Warn("held as the outage begins")
		o.Flush()
		if got := out.String(); got != "" {
			t.Errorf("%q written, want the warning muted", got)
		}
	})
}

// Within its tail after an outage, River's records of the outage are
// dropped: its completer's tries and a failure for an unreachable
// database. A failure for another reason passes, and so does everything
// once the tail is over.
func TestRiverTailDropsTheOutagesRecordsOnly(t *testing.T) {
	t.Parallel()
	var o outageMuter
	out := &syncBuffer{}
	tail := time.Hour
	log := slog.New(riverTail{Handler: slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}), o: &o, tail: tail})
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	records := func() {
		log.Error("jobcompleter.BatchCompleter: Completer error (will retry after sleep)", "attempt", 3, "err", unreachable.Error())
		log.Error("jobcompleter.BatchCompleter: Too many errors; giving up")
		log.Error("jobcompleter.BatchCompleter: Error completing batch", "err", unreachable)
		log.Error("jobcompleter.BatchCompleter: Error completing batch", "err", errors.New("another failure"))
	}
	records() // no outage yet: all pass
	if got := strings.Count(out.String(), "\n"); got != 4 {
		t.Errorf("before any outage %d records passed, want 4:\n%s", got, out)
	}
	o.Begin()
	o.End()
	before := out.String()
	records()
	if got := strings.TrimPrefix(out.String(), before); got != "level=ERROR msg=\"jobcompleter.BatchCompleter: Error completing batch\" err=\"another failure\"\n" {
		t.Errorf("after the outage: %q, want the failure for another reason alone", got)
	}
	o.ended.Store(time.Now().Add(-tail).UnixNano())
	before = out.String()
	records()
	if got := strings.Count(strings.TrimPrefix(out.String(), before), "\n"); got != 4 {
		t.Errorf("after the tail %d records passed, want 4", got)
	}
}
