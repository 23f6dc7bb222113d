package damacli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dama-etl/dama/config"
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
// its newest events and the last lines of its output that the database keeps.
func describeTask(ctx context.Context, db etlcontext.DB, w io.Writer, t etlcontext.Task) error {
	n, err := readNotes(ctx, db, []etlcontext.Task{t})
	if err != nil {
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
	pieces, err := etlcontext.LogSince(ctx, db, t.ID, etlcontext.LogPos{}, 1<<20)
	if err != nil {
		return err
	}
	if len(checkpoint) == 0 || string(checkpoint) == "null" {
		checkpoint = []byte("-")
	}
	progress := bar(t.Progress, 20)
	if eta, ok := n.eta(t); ok {
		progress += "  " + eta
	}
	at := func(p *time.Time) string {
		if p == nil {
			return "-"
		}
		return localTime(*p, n.now)
	}
	// One writer for every section: a line without a tab (a blank one, a
	// title) ends a block of aligned columns, and shownText leaves no tab.
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Task %d  %s  %s  attempt %d/%d\n", t.ID, t.Kind, t.Status, t.Attempt, t.MaxAttempts)
	fmt.Fprintf(tw, "Reason:\t%s\n", n.reason(t))
	fmt.Fprintf(tw, "Progress:\t%s\n", progress)
	fmt.Fprintf(tw, "Queue:\t%s\n", shownText(t.Queue))
	fmt.Fprintf(tw, "Submitted:\t%s\n", at(&t.CreatedAt))
	fmt.Fprintf(tw, "Started:\t%s\n", at(t.StartedAt))
	fmt.Fprintf(tw, "Finished:\t%s\n", at(t.FinishedAt))
	fmt.Fprintf(tw, "Ran for:\t%s\n", n.ranFor(t))
	fmt.Fprintf(tw, "Arguments:\t%s\n", shownText(cut(string(args))))
	fmt.Fprintf(tw, "Checkpoint:\t%s\n", shownText(cut(string(checkpoint))))
	fmt.Fprintf(tw, "Children:\t%s\n", t.Children.String())
	if t.ParentID != nil {
		fmt.Fprintf(tw, "Parent:\t%d\n", *t.ParentID)
	}

	fmt.Fprintf(tw, "\nAttempts (newest %d):\n", describeAttempts)
	// What attempts cost is shown where one was measured (in a control
	// group of its own: docs/configuration.md "Resources").
	measured := slices.ContainsFunc(attempts, func(a etlcontext.Attempt) bool { return a.CPUSeconds != nil })
	cost := ""
	if measured {
		cost = "CPU\tPEAK MEM\tREAD/WRITTEN\t"
	}
	fmt.Fprintln(tw, "  #\tHOST\tPID\tSTARTED\tENDED\tOUTCOME\tEXIT\t"+cost+"REASON")
	for _, a := range attempts {
		exit := "-"
		switch {
		case a.ExitCode != nil:
			exit = strconv.Itoa(*a.ExitCode)
		case a.Outcome != nil && *a.Outcome == string(etlcontext.StatusDone):
			exit = "0"
		}
		if measured {
			exit += "\t" + attemptCost(a)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, shownText(orDash(a.Host)), intOrDash(a.PID),
			at(&a.StartedAt), at(a.EndedAt), orDash(a.Outcome), exit, shownText(orDash(a.Reason)))
	}

	fmt.Fprintf(tw, "\nEvents (newest %d):\n", describeEvents)
	for _, e := range events {
		what := cmp.Or(e.Summary, string(e.Payload))
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", at(&e.CreatedAt), e.Type, shownText(cut(what)))
	}

	fmt.Fprintf(tw, "\nLog (the last %d lines the database keeps; dama logs %d for all):\n", describeLogLines, t.ID)
	var log strings.Builder
	for _, p := range pieces {
		log.Write(p.Data)
	}
	lines := strings.Split(strings.TrimRight(log.String(), "\n"), "\n")
	if log.Len() == 0 {
		lines = []string{"(none kept)"}
	}
	for _, line := range lines[max(0, len(lines)-describeLogLines):] {
		fmt.Fprintf(tw, "  %s\n", shownText(line))
	}
	return tw.Flush()
}

// attemptCost is the CPU, PEAK MEM and READ/WRITTEN columns of a.
func attemptCost(a etlcontext.Attempt) string {
	cpu, mem, io := "-", "-", "-"
	if a.CPUSeconds != nil {
		cpu = time.Duration(*a.CPUSeconds * float64(time.Second)).Round(time.Millisecond).String()
	}
	if a.PeakMemory != nil {
		mem = config.ByteSize(*a.PeakMemory).String()
		if a.MemoryLimit != nil {
			mem += " of " + config.ByteSize(*a.MemoryLimit).String()
		}
	}
	if a.ReadBytes != nil && a.WriteBytes != nil {
		io = config.ByteSize(*a.ReadBytes).String() + "/" + config.ByteSize(*a.WriteBytes).String()
	}
	return cpu + "\t" + mem + "\t" + io
}

// cut shortens s to describeText runes.
func cut(s string) string {
	if r := []rune(s); len(r) > describeText {
		return string(r[:describeText]) + "…"
	}
	return s
}
