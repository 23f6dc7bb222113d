package etlcontext

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
)

// Reason says in a few words why a task is where it is, for the status
// list and the page alike: what a waiting task waits for and since when,
// a retrying one's last error and when it is retried, when a queued one
// is due, that a running one is being cancelled, awaits its children or
// is stalled, a failed one's last error. Its texts are the task's and its
// command's words: whoever shows them escapes them.
type Reason struct {
	// Text is what it waits for or what went wrong, if anything.
	Text string `json:"text,omitempty"`
	// Since is when the wait (or the cancelling) began; Until, when the
	// task is due. At most one is set.
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// Retry says that Text is the error a retry follows, due at Until
	// (or now).
	Retry bool `json:"retry,omitempty"`
	// After is the error a retry follows, when Text says what it waits for.
	After string `json:"after,omitempty"`
}

// Format writes the reason in one line at now: "-" when there is nothing
// to say; a wait's start by at.
func (r Reason) Format(now time.Time, at func(time.Time) string) string {
	s := r.Text
	add := func(sep, part string) {
		if s != "" {
			s += sep
		}
		s += part
	}
	if r.Since != nil {
		add(" ", "since "+at(*r.Since))
	}
	switch {
	case r.Retry && r.Until != nil:
		add(", ", "retry in "+Human(r.Until.Sub(now)))
	case r.Retry:
		add(", ", "retrying")
	case r.Until != nil:
		add(" ", "due in "+Human(r.Until.Sub(now)))
	}
	if r.After != "" {
		add(", ", "after: "+r.After)
	}
	return cmp.Or(s, "-")
}

// Human writes d to its two largest units: 45s, 12m5s, 3h12m, 2d3h.
func Human(d time.Duration) string {
	d = max(d, 0)
	const day = 24 * time.Hour
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < day:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/day), int(d%day/time.Hour))
}

// ReasonOf is the Reason of task t at now, tr its Trouble.
func ReasonOf(t Task, tr Trouble, now time.Time) Reason {
	switch t.Status {
	case StatusQueued, StatusRetrying:
		failed := ""
		if t.Status == StatusRetrying {
			failed = oneLine(tr.Error)
		}
		switch {
		case tr.Unserved && tr.KindServed:
			return Reason{Text: fmt.Sprintf("waiting: no supervisor serves kind %s in queue %s", t.Kind, t.Queue), After: failed}
		case tr.Unserved:
			text := "waiting: no supervisor serves kind " + t.Kind
			if tr.LastServed != nil {
				text += fmt.Sprintf(" (last seen %s ago on %s)", Human(now.Sub(*tr.LastServed)), tr.LastServedHost)
			}
			return Reason{Text: text, After: failed}
		case tr.Unfit != "":
			return Reason{Text: fmt.Sprintf("waiting: %s on host %s", tr.Unfit, tr.Host), Since: &tr.At, After: failed}
		case t.WaitingFor != nil:
			return Reason{Text: "waiting: " + waitingWords(*t.WaitingFor), Since: t.WaitingSince, After: failed}
		case t.DueAt != nil && t.DueAt.After(now):
			return Reason{Text: failed, Until: t.DueAt, Retry: failed != ""}
		case failed != "":
			return Reason{Text: failed, Retry: true}
		}
	case StatusRunning:
		switch {
		case t.CancelRequestedAt != nil:
			return Reason{Text: "cancelling", Since: t.CancelRequestedAt}
		case t.LatestEventType != nil && protocol.EventSuffix(*t.LatestEventType) == protocol.EventAwaiting:
			return Reason{Text: "awaiting children: " + t.Children.String()}
		case t.Stalled != nil:
			var s struct {
				After  string    `json:"stall_after"`
				LastAt time.Time `json:"last_at"`
			}
			err := json.Unmarshal(t.Stalled, &s)
			after, perr := time.ParseDuration(s.After)
			if err != nil || perr != nil || s.LastAt.IsZero() {
				return Reason{Text: "stalled"}
			}
			return Reason{Text: StallReason(after, s.LastAt)}
		}
	case StatusFailed:
		return Reason{Text: oneLine(tr.Error)}
	}
	return Reason{}
}

// waitingWords says what a task's waiting_for means.
func waitingWords(w string) string {
	switch w {
	case "queue_paused":
		return "its queue is paused"
	case "kind_blocked":
		return "its kind is blocked"
	case "queue_full":
		return "a slot of its queue"
	case "kind_full":
		return "a slot of its kind"
	case "key_full":
		return "a slot of its concurrency key"
	case "sessions":
		return "its previous run's database sessions to end"
	}
	return w
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// String summarizes the children: how many are DONE of how many, and how
// many did not end DONE; "-" for none.
func (c Children) String() string {
	if len(c) == 0 {
		return "-"
	}
	total := c.Pending() + c[StatusDone] + c.Failed()
	s := fmt.Sprintf("%d/%d done", c[StatusDone], total)
	if f := c.Failed(); f > 0 {
		s += fmt.Sprintf(", %d failed", f)
	}
	return s
}

// StallReason says that a command reported nothing for after, since
// lastAt: the reason of a task marked stalled, and of the attempt that
// on_stall kill ended.
func StallReason(after time.Duration, lastAt time.Time) string {
	return fmt.Sprintf("stalled: no progress for %s, last at %s", shortDuration(after), lastAt.UTC().Format("2006-01-02 15:04:05 UTC"))
}

// shortDuration writes d as a configuration does: 30m, not 30m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
