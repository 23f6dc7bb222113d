package damacli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
)

func newStatusCommand() *cobra.Command {
	var (
		asJSON   bool
		output   string
		limit    int
		statuses []string
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show tasks from data_manager.dama_task_queue",
		Long: `Show tasks from data_manager.dama_task_queue, newest first: one task by ID,
or the newest --limit tasks, optionally only those in the given --status.

One task by ID is shown in full: where it is and why, its arguments and
checkpoint, each attempt (host, pid, start, end, outcome, exit code,
reason), its children, its newest events and the last lines of its log
(-o wide: its row of the table instead).

The table's columns: the task's id, kind, status and attempt, its progress,
its time left at its pace (ETA) while it runs or how long it ran, and a
reason: what it waits for, until when, the last error. It fits the
terminal's width (or $COLUMNS): a narrow one drops the reason, the attempt,
the time and the kind, never the progress. -o wide shows every column.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			q := etlcontext.TaskQuery{Limit: limit}
			if len(argv) == 1 {
				var err error
				if q.ID, err = parseID(argv[0]); err != nil {
					return err
				}
			}
			if limit < 0 {
				return errors.New("--limit must not be negative")
			}
			for _, st := range statuses {
				st := etlcontext.Status(strings.ToUpper(st))
				if !slices.Contains(etlcontext.Statuses, st) {
					return fmt.Errorf("unknown status %q: want one of %v", st, etlcontext.Statuses)
				}
				q.Statuses = append(q.Statuses, st)
			}
			id := q.ID
			if watch && asJSON {
				return errors.New("--watch and --json exclude each other")
			}
			if output != "" && output != "wide" {
				return fmt.Errorf("-o %s: want wide (or --json)", quoteArg(output))
			}
			wide := output == "wide"
			if watch && interval < 100*time.Millisecond {
				return errors.New("--interval must be at least 100ms")
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			tasks, err := etlcontext.Tasks(cmd.Context(), pool, q)
			if err != nil {
				return err
			}
			if id != 0 && len(tasks) == 0 {
				return fmt.Errorf("task %d not found", id)
			}
			if watch {
				return watchTasks(cmd.Context(), pool, q, cmd.OutOrStdout(), interval, wide)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(jsonShown{out})
				enc.SetIndent("", "  ")
				if id != 0 {
					return enc.Encode(tasks[0])
				}
				return enc.Encode(tasks)
			}
			if id != 0 && !wide {
				return describeTask(cmd.Context(), pool, out, tasks[0])
			}
			return printTasks(cmd.Context(), pool, out, tasks, wide, columns(out))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, every column")
	cmd.Flags().StringVarP(&output, "output", "o", "", "wide: every column, River's job and the process included")
	cmd.Flags().IntVar(&limit, "limit", 50, "show at most this many tasks, newest first (0: all)")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "show only tasks in these statuses (QUEUED,RUNNING,...)")
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw the table, with progress bars, every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often --watch redraws")
	return cmd
}

// printTasks prints tasks as a table, newest first: by default the
// columns that say where each task is, fitted to cols when it is
// positive; wide, every column. Progress is a bar with a percentage;
// durations as people write them (3h12m), times in the local zone.
func printTasks(ctx context.Context, db etlcontext.DB, w io.Writer, tasks []etlcontext.Task, wide bool, cols int) error {
	var running, all []int64
	for _, t := range tasks {
		all = append(all, t.ID)
		if t.Status == etlcontext.StatusRunning {
			running = append(running, t.ID)
		}
	}
	paces := map[int64]etlcontext.Pace{}
	troubles := map[int64]etlcontext.Trouble{}
	if len(running) > 0 {
		var err error
		if paces, err = etlcontext.Paces(ctx, db, running); err != nil {
			return err
		}
	}
	if len(all) > 0 {
		var err error
		if troubles, err = etlcontext.Troubles(ctx, db, all); err != nil {
			return err
		}
	}
	now := time.Now()
	if wide {
		return printWide(w, tasks, paces, troubles, now)
	}
	rows := [][]string{{"ID", "KIND", "STATUS", "ATTEMPT", "PROGRESS", "TIME", "REASON"}}
	for _, t := range tasks {
		pace, running := paces[t.ID]
		progress := "-"
		if len(t.Progress) > 0 {
			progress = bar(t.Progress, 10)
		}
		took := ranFor(t, pace, running, now)
		if left, ok := pace.Remaining(t.Progress, t.ProgressAt, now); ok && running {
			took = "ETA " + human(left)
		}
		rows = append(rows, []string{strconv.FormatInt(t.ID, 10), t.Kind, string(t.Status), fmt.Sprintf("%d/%d", t.Attempt, t.MaxAttempts),
			progress, took, reason(t, troubles[t.ID], now)})
	}
	for _, line := range fitTable(rows, cols) {
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// The columns of the default table a narrow terminal drops, first to
// last: never the id, the status or the progress.
const (
	colKind    = 1
	colAttempt = 3
	colTime    = 5
	colReason  = 6
)

// minReason is the narrowest a reason is cut to before the time and the
// kind are dropped for it.
const minReason = 24

// fitTable lays rows out in columns two spaces apart, within cols runes
// when cols is positive: the reason, last, is cut short to fit, down to
// minReason, after dropping the attempt, then the time, then the kind;
// then cut further, or dropped. The id, the status and the progress stay.
func fitTable(rows [][]string, cols int) []string {
	keep := map[int]bool{}
	for i := range rows[0] {
		keep[i] = true
	}
	widths := func() (w []int, total int) {
		w = make([]int, len(rows[0]))
		for _, r := range rows {
			for i, c := range r {
				w[i] = max(w[i], utf8.RuneCountInString(c))
			}
		}
		n := 0
		for i, x := range w {
			if keep[i] {
				total += x
				n++
			}
		}
		return w, total + 2*(n-1)
	}
	w, total := widths()
	// cut cuts the reason to what the other columns leave, if that is at
	// least least runes.
	cut := func(least int) bool {
		if !keep[colReason] || total-w[colReason]+least > cols {
			return false
		}
		w[colReason] -= total - cols
		total = cols
		return true
	}
	fitted := cols <= 0 || total <= cols || cut(minReason)
	for _, drop := range []int{colAttempt, colTime, colKind} {
		if fitted {
			break
		}
		keep[drop] = false
		w, total = widths()
		fitted = total <= cols || cut(minReason)
	}
	if !fitted && !cut(len("REASON")) {
		keep[colReason] = false
	}
	lines := make([]string, 0, len(rows))
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if !keep[i] {
				continue
			}
			if b.Len() > 0 {
				b.WriteString("  ")
			}
			if n := utf8.RuneCountInString(c); n > w[i] {
				c = string([]rune(c)[:w[i]-1]) + "…"
			}
			b.WriteString(c + strings.Repeat(" ", w[i]-utf8.RuneCountInString(c)))
		}
		lines = append(lines, strings.TrimRight(b.String(), " "))
	}
	return lines
}

// printWide prints every column of tasks, River's job and the process
// included, and the reason.
func printWide(w io.Writer, tasks []etlcontext.Task, paces map[int64]etlcontext.Pace, troubles map[int64]etlcontext.Trouble, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tSTATUS\tATTEMPT\tJOB\tWAITING\tCHILDREN\tHOST\tPID\tLOCKED\tRUNTIME\tLATEST EVENT\tPROGRESS\tREASON")
	for _, t := range tasks {
		latest := "-"
		if t.LatestEventType != nil {
			latest = *t.LatestEventType
			if t.LatestEventAt != nil {
				latest += " " + localTime(*t.LatestEventAt, now)
			}
		}
		pace, running := paces[t.ID]
		shown := "-"
		if len(t.Progress) > 0 {
			shown = bar(t.Progress, 20)
			if left, ok := pace.Remaining(t.Progress, t.ProgressAt, now); ok && running {
				shown += " ETA " + human(left)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\n",
			t.ID, t.Kind, shownText(t.Queue), t.Status, t.Attempt, t.MaxAttempts,
			orDash(t.JobState), waiting(t), t.Children.String(), shownText(orDash(t.Host)), intOrDash(t.PID), t.InitialEventLocked,
			ranFor(t, pace, running, now), shownText(latest), shown, reason(t, troubles[t.ID], now))
	}
	return tw.Flush()
}

// reason says in a few words why a task is where it is: what a waiting
// task waits for, or until when; that a running one is being cancelled or
// awaits its children; a failed one's last error.
func reason(t etlcontext.Task, tr etlcontext.Trouble, now time.Time) string {
	return shownText(etlcontext.ReasonOf(t, tr, now).Format(func(at time.Time) string { return localTime(at, now) }))
}

// columns is how wide a table for w may be: a terminal's width, else
// $COLUMNS, else 0 for no bound.
func columns(w io.Writer) int {
	if cols, _, tty := terminalSize(w); tty {
		return cols
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 0
}

// ranFor is how long a task has run: its current attempt so far, while
// it runs; from its first start to its end, once finished.
func ranFor(t etlcontext.Task, pace etlcontext.Pace, running bool, now time.Time) string {
	switch {
	case running:
		return human(now.Sub(pace.StartedAt))
	case t.Status.Finished() && t.StartedAt != nil && t.FinishedAt != nil:
		return human(t.FinishedAt.Sub(*t.StartedAt))
	}
	return "-"
}

// human writes d as people do, to its two largest units: 45s, 12m5s,
// 3h12m, 2d3h.
func human(d time.Duration) string {
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

// localTime writes t in the local zone: its time of day when it is of
// now's day, else its date too.
func localTime(t, now time.Time) string {
	t, now = t.Local(), now.Local()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format(time.TimeOnly)
	}
	return t.Format(time.DateTime)
}

// waiting says why a task that has not started waits: until when it is
// due, or for what.
func waiting(t etlcontext.Task) string {
	switch {
	case t.Status != etlcontext.StatusQueued && t.Status != etlcontext.StatusRetrying:
		return "-"
	case t.WaitingFor != nil:
		return *t.WaitingFor
	case t.DueAt != nil && t.DueAt.After(time.Now()):
		return "until " + t.DueAt.Local().Format(time.DateTime)
	}
	return "-"
}

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func intOrDash(i *int) string {
	if i == nil {
		return "-"
	}
	return strconv.Itoa(*i)
}
