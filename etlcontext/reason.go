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
// until when it is due, that a running one is being cancelled, awaits its
// children or is stalled, a failed one's last error. Its texts are the
// task's and its command's words: whoever shows them escapes them.
type Reason struct {
	// Text is what it waits for or what went wrong, if anything.
	Text string `json:"text,omitempty"`
	// Since is when the wait (or the cancelling) began; Until, when the
	// task is due. At most one is set.
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// After is the error a retry follows.
	After string `json:"after,omitempty"`
}

// Format writes the reason in one line, its time by at; "-" when there is
// nothing to say.
func (r Reason) Format(at func(time.Time) string) string {
	var parts []string
	if r.Text != "" {
		parts = append(parts, r.Text)
	}
	if r.Since != nil {
		parts = append(parts, "since "+at(*r.Since))
	}
	if r.Until != nil {
		parts = append(parts, "until "+at(*r.Until))
	}
	s := strings.Join(parts, " ")
	if r.After != "" {
		if s != "" {
			s += ", "
		}
		s += "after: " + r.After
	}
	return cmp.Or(s, "-")
}

// ReasonOf is the Reason of task t at now, tr its Trouble.
func ReasonOf(t Task, tr Trouble, now time.Time) Reason {
	switch t.Status {
	case StatusQueued, StatusRetrying:
		switch {
		case tr.Unfit != "":
			return Reason{Text: fmt.Sprintf("waiting: %s on host %s", tr.Unfit, tr.Host), Since: &tr.At}
		case t.WaitingFor != nil:
			return Reason{Text: "waiting: " + waitingWords(*t.WaitingFor), Since: t.WaitingSince}
		case t.DueAt != nil && t.DueAt.After(now):
			r := Reason{Until: t.DueAt}
			if t.Status == StatusRetrying {
				r.After = oneLine(tr.Error)
			}
			return r
		case t.Status == StatusRetrying && tr.Error != "":
			return Reason{Text: "retrying", After: oneLine(tr.Error)}
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
