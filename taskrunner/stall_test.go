package taskrunner

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/protocol"
)

// A look marks the command stalled once it reported nothing for
// stall_after, and clears the mark at its next report: a line, output to
// its log, or a line waiting for room in the writer (a database away is no
// stall). The runner's own lines in the log, and the log truncated, are no
// report. The looks are given their times: the end-to-end test
// (TestAStalledTaskIsMarkedClearedAndKilled) keeps the clock's.
func TestALookMarksAQuietCommandAndClearsTheMark(t *testing.T) {
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "1.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	own := &ownLog{w: f}
	r := &runner{opts: Options{ownLog: own}, logFile: f, logger: slog.New(slog.NewTextHandler(own, nil)),
		kind: config.Kind{StallAfter: config.Duration(time.Minute), OnStall: config.OnStallWarn},
		w:    newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})}
	r.w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	lines := &eventsReader{}
	w := &commandWatch{r: r, stall: stallState{events: lines}}
	start := time.Now()
	_, stop := w.stallLooks(start)
	stop()

	var got []string
	for _, step := range []struct {
		at   time.Duration
		do   func()
		want string // the event the look queues, if any
	}{
		{59 * time.Second, nil, ""},
		{60 * time.Second, nil, "STALLED 0s"},
		{61 * time.Second, nil, ""}, // its own line, "command stalled", was no report
		{62 * time.Second, func() { _, _ = f.WriteString("a line\n") }, "UNSTALLED"},
		{121 * time.Second, func() { _ = f.Truncate(0) }, ""},
		{122 * time.Second, nil, "STALLED 1m2s"},
		{123 * time.Second, func() { _, _ = f.WriteString("a line\n") }, "UNSTALLED"},
		{183 * time.Second, nil, "STALLED 2m3s"},
		{184 * time.Second, func() { lines.waiting.Store(true) }, "UNSTALLED"},
		{400 * time.Second, nil, ""},
		{401 * time.Second, func() { lines.waiting.Store(false); lines.lines.Add(1) }, ""},
		{460 * time.Second, nil, ""},
		{461 * time.Second, nil, "STALLED 6m41s"},
		{462 * time.Second, func() { lines.lines.Add(1) }, "UNSTALLED"},
		// Being stopped, it is quiet as it should be.
		{600 * time.Second, func() { w.stopReason = "cancel requested" }, ""},
	} {
		if step.do != nil {
			step.do()
		}
		queued := len(r.w.events)
		w.lookForStall(start.Add(step.at))
		var ev string
		for _, e := range r.w.events[queued:] {
			ev = strings.TrimPrefix(e.ev.Type, "k:")
			var p struct {
				LastAt time.Time `json:"last_at"`
			}
			if raw, ok := e.ev.Payload.(json.RawMessage); ok && ev == "STALLED" && json.Unmarshal(raw, &p) == nil {
				ev += " " + p.LastAt.Sub(start).String()
			}
		}
		if ev != step.want {
			got = append(got, step.at.String()+": "+ev+", want "+step.want)
		}
	}
	if len(got) > 0 {
		b, _ := json.MarshalIndent(got, "", "  ")
		t.Errorf("looks:\n%s", b)
	}
}

// The first of stall_after and timeout to stop the command says whether
// the attempt fails for good: a timeout while a stalled command is being
// stopped does not make its failure final.
func TestTheFirstToStopTheCommandDecides(t *testing.T) {
	ended := make(chan struct{})
	close(ended)
	r := &runner{logger: slog.New(slog.DiscardHandler),
		kind: config.Kind{Timeout: config.Duration(time.Hour), OnTimeout: config.OnTimeoutFail, KillGrace: new(config.Duration)},
		w:    newWriter("", "test", slog.New(slog.DiscardHandler), time.Second, writerHooks{})}
	r.w.bind(1, "00000000-0000-0000-0000-000000000001", "k")
	w := &commandWatch{r: r, proc: &started{signal: func(syscall.Signal) {}, ended: ended}}
	w.expire(protocol.EventStalled, nil, "stalled: no progress for 1m0s", false)
	w.timeout()
	if !w.timedOut || w.final || w.stopReason != "stalled: no progress for 1m0s" {
		t.Errorf("timed out %t, final %t, stopped for %q; want the stall's, not final", w.timedOut, w.final, w.stopReason)
	}
}
