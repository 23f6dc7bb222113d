package damacli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dama-etl/dama/etlcontext"
)

// The detail view's bounds: what it shows of a task's history.
const (
	describeAttempts = 10
	describeEvents   = 10
	describeLogLines = 10
	describeText     = 300
)

// describeTask prints one task in full, as kubectl describe does: where
// it is and why, its arguments and checkpoint, each attempt, its children,
// its newest events and the last lines of its output that the database
// keeps. Whatever a task wrote is shown with its control characters
// written out (shownText).
func describeTask(ctx context.Context, db etlcontext.DB, w io.Writer, t etlcontext.Task) error {
	now := time.Now()
	var (
		paces    = map[int64]etlcontext.Pace{}
		troubles map[int64]etlcontext.Trouble
		err      error
	)
	if t.Status == etlcontext.StatusRunning {
		if paces, err = etlcontext.Paces(ctx, db, []int64{t.ID}); err != nil {
			return err
		}
	}
	if troubles, err = etlcontext.Troubles(ctx, db, []int64{t.ID}); err != nil {
		return err
	}
	args, checkpoint, err := etlcontext.Payloads(ctx, db, t.ID)
	if err != nil {
		return err
	}
	attempts, err := etlcontext.RecentAttempts(ctx, db, t.ID, describeAttempts, describeText)
	if err != nil {
		return err
	}
	events, err := etlcontext.RecentEvents(ctx, db, t.ID, describeEvents, describeText)
	if err != nil {
		return err
	}
	pace, running := paces[t.ID]
	progress := "-"
	if len(t.Progress) > 0 {
		progress = bar(t.Progress, 20)
		if left, ok := pace.Remaining(t.Progress, t.ProgressAt, now); ok && running {
			progress += "  ETA " + human(left)
		}
	}
	at := func(p *time.Time) string {
		if p == nil {
			return "-"
		}
		return localTime(*p, now)
	}
	fmt.Fprintf(w, "Task %d  %s  %s  attempt %d/%d\n", t.ID, t.Kind, t.Status, t.Attempt, t.MaxAttempts)
	kv := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(kv, "Reason:\t%s\n", reason(t, troubles[t.ID], now))
	fmt.Fprintf(kv, "Progress:\t%s\n", progress)
	fmt.Fprintf(kv, "Queue:\t%s\n", shownText(t.Queue))
	fmt.Fprintf(kv, "Submitted:\t%s\n", localTime(t.CreatedAt, now))
	fmt.Fprintf(kv, "Started:\t%s\n", at(t.StartedAt))
	fmt.Fprintf(kv, "Finished:\t%s\n", at(t.FinishedAt))
	fmt.Fprintf(kv, "Ran for:\t%s\n", ranFor(t, pace, running, now))
	fmt.Fprintf(kv, "Arguments:\t%s\n", shownText(cut(string(args))))
	fmt.Fprintf(kv, "Checkpoint:\t%s\n", shownText(cut(orDash(rawString(checkpoint)))))
	fmt.Fprintf(kv, "Children:\t%s\n", t.Children.String())
	if t.ParentID != nil {
		fmt.Fprintf(kv, "Parent:\t%d\n", *t.ParentID)
	}
	if err := kv.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nAttempts (newest %d):\n", describeAttempts)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tHOST\tPID\tSTARTED\tENDED\tOUTCOME\tEXIT\tREASON")
	for _, a := range attempts {
		exit := "-"
		switch {
		case a.ExitCode != nil:
			exit = strconv.Itoa(*a.ExitCode)
		case a.Outcome != nil && *a.Outcome == string(etlcontext.StatusDone):
			exit = "0"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, shownText(orDash(a.Host)), intOrDash(a.PID),
			localTime(a.StartedAt, now), at(a.EndedAt), orDash(a.Outcome), exit, shownText(orDash(a.Reason)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nEvents (newest %d):\n", describeEvents)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, e := range events {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", localTime(e.CreatedAt, now), e.Type, shownText(cut(string(e.Payload))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nLog (the last %d lines the database keeps; dama logs %d for all):\n", describeLogLines, t.ID)
	pieces, err := etlcontext.LogSince(ctx, db, t.ID, etlcontext.LogPos{}, 1<<20)
	if err != nil {
		return err
	}
	var log strings.Builder
	for _, p := range pieces {
		log.Write(p.Data)
	}
	if log.Len() == 0 {
		fmt.Fprintln(w, "  (none kept)")
		return nil
	}
	lines := strings.Split(strings.TrimRight(log.String(), "\n"), "\n")
	for _, line := range lines[max(0, len(lines)-describeLogLines):] {
		fmt.Fprintf(w, "  %s\n", shownText(line))
	}
	return nil
}

// cut shortens s to describeText runes.
func cut(s string) string {
	if r := []rune(s); len(r) > describeText {
		return string(r[:describeText]) + "…"
	}
	return s
}

// rawString is a JSON value's text, nil when there is none.
func rawString(b []byte) *string {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	s := string(b)
	return &s
}
