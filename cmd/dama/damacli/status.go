package damacli

import (
	"context"
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
		Long: `Show tasks from data_manager.dama_task_queue: one task by ID, or --limit
tasks, the running first, then the retrying, then the queued, then the
finished, each newest first; or only those in the given --status, newest
first. Times are in the local time zone, named.

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
			q := etlcontext.TaskQuery{Limit: limit, ActiveFirst: true}
			if len(argv) == 1 {
				var err error
				if q.ID, err = parseID(argv[0]); err != nil {
					return err
				}
			}
			switch {
			case limit < 0:
				return errors.New("--limit must not be negative")
			case watch && asJSON:
				return errors.New("--watch and --json exclude each other")
			case output != "" && output != "wide":
				return fmt.Errorf("-o %s: want wide (or --json)", quoteArg(output))
			case watch && interval < 100*time.Millisecond:
				return errors.New("--interval must be at least 100ms")
			}
			for _, st := range statuses {
				st := etlcontext.Status(strings.ToUpper(st))
				if !slices.Contains(etlcontext.Statuses, st) {
					return fmt.Errorf("unknown status %q: want one of %v", st, etlcontext.Statuses)
				}
				q.Statuses = append(q.Statuses, st)
			}
			wide := output == "wide"
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			tasks, err := etlcontext.Tasks(cmd.Context(), pool, q)
			if err != nil {
				return err
			}
			if q.ID != 0 && len(tasks) == 0 {
				return fmt.Errorf("task %d not found", q.ID)
			}
			if watch {
				return watchTasks(cmd.Context(), pool, q, cmd.OutOrStdout(), interval, wide)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if q.ID != 0 {
					return printJSON(out, tasks[0])
				}
				return printJSON(out, tasks)
			}
			if q.ID != 0 && !wide {
				return describeTask(cmd.Context(), pool, out, tasks[0])
			}
			return printTasks(cmd.Context(), pool, out, tasks, wide, columns(out))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, every column")
	cmd.Flags().StringVarP(&output, "output", "o", "", "wide: every column, River's job and the process included")
	cmd.Flags().IntVar(&limit, "limit", 50, "show at most this many tasks, the active first (0: all)")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "show only tasks in these statuses (QUEUED,RUNNING,...)")
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw the table, with progress bars, every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often --watch redraws")
	return cmd
}

// notes are what is said of tasks beside their rows: the paces of the
// running ones and the troubles of all, at now.
type notes struct {
	paces    map[int64]etlcontext.Pace
	troubles map[int64]etlcontext.Trouble
	now      time.Time
}

// readNotes reads the notes of tasks, in at most two statements.
func readNotes(ctx context.Context, db etlcontext.DB, tasks []etlcontext.Task) (notes, error) {
	var all, running []int64
	for _, t := range tasks {
		all = append(all, t.ID)
		if t.Status == etlcontext.StatusRunning {
			running = append(running, t.ID)
		}
	}
	var n notes
	var err error
	if len(running) > 0 {
		if n.paces, err = etlcontext.Paces(ctx, db, running); err != nil {
			return n, err
		}
	}
	if len(all) > 0 {
		if n.troubles, err = etlcontext.Troubles(ctx, db, all); err != nil {
			return n, err
		}
	}
	n.now = time.Now()
	return n, nil
}

// eta is "ETA 3m12s": the time a running task (one with a pace) has left
// at its pace, when its progress tells.
func (n notes) eta(t etlcontext.Task) (string, bool) {
	left, ok := n.paces[t.ID].Remaining(t.Progress, t.ProgressAt, n.now)
	return "ETA " + etlcontext.Human(left), ok
}

// ranFor is how long a task has run: its current attempt so far, while
// it runs; from its first start to its end, once finished.
func (n notes) ranFor(t etlcontext.Task) string {
	if pace, running := n.paces[t.ID]; running {
		return etlcontext.Human(n.now.Sub(pace.StartedAt))
	}
	if t.Status.Finished() && t.StartedAt != nil && t.FinishedAt != nil {
		return etlcontext.Human(t.FinishedAt.Sub(*t.StartedAt))
	}
	return "-"
}

func (n notes) reason(t etlcontext.Task) string {
	return reason(t, n.troubles[t.ID], n.now)
}

// printTasks prints tasks as a table: by default the columns that say
// where each task is, fitted to cols when it is positive; wide, every column.
func printTasks(ctx context.Context, db etlcontext.DB, w io.Writer, tasks []etlcontext.Task, wide bool, cols int) error {
	n, err := readNotes(ctx, db, tasks)
	if err != nil {
		return err
	}
	if wide {
		return printWide(w, tasks, n)
	}
	rows := [][]string{{"ID", "KIND", "STATUS", "ATTEMPT", "PROGRESS", "TIME", "REASON"}}
	for _, t := range tasks {
		took := n.ranFor(t)
		if eta, ok := n.eta(t); ok {
			took = eta
		}
		rows = append(rows, []string{strconv.FormatInt(t.ID, 10), t.Kind, string(t.Status), fmt.Sprintf("%d/%d", t.Attempt, t.MaxAttempts),
			bar(t.Progress, 10), took, n.reason(t)})
	}
	for _, line := range fitTable(rows, cols) {
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// The columns of the default table a narrow terminal drops.
const (
	colKind    = 1
	colAttempt = 3
	colTime    = 5
	colReason  = 6
)

// minReason is the narrowest a reason is cut to before columns are dropped.
const minReason = 24

// fitTable lays rows out in columns two spaces apart, within cols runes
// when cols is positive: the reason, last, is cut short to fit, down to
// minReason, after dropping the attempt, then the time, then the kind;
// then cut further, or dropped. The id, the status and the progress stay.
func fitTable(rows [][]string, cols int) []string {
	w := make([]int, len(rows[0]))
	dropped := make([]bool, len(w))
	for _, r := range rows {
		for i, c := range r {
			w[i] = max(w[i], utf8.RuneCountInString(c))
		}
	}
	width := func() int {
		total, n := 0, 0
		for i, x := range w {
			if !dropped[i] {
				total += x
				n++
			}
		}
		return total + 2*(n-1)
	}
	// cut cuts the reason to what the other columns leave, if that is at
	// least least runes.
	cut := func(least int) bool {
		others := width() - w[colReason]
		if dropped[colReason] || others+least > cols {
			return false
		}
		w[colReason] = cols - others
		return true
	}
	fitted := cols <= 0 || width() <= cols || cut(minReason)
	for _, drop := range []int{colAttempt, colTime, colKind} {
		if fitted {
			break
		}
		dropped[drop] = true
		fitted = width() <= cols || cut(minReason)
	}
	if !fitted && !cut(len("REASON")) {
		dropped[colReason] = true
	}
	lines := make([]string, 0, len(rows))
	for _, r := range rows {
		var cells []string
		for i, c := range r {
			if dropped[i] {
				continue
			}
			if utf8.RuneCountInString(c) > w[i] {
				c = string([]rune(c)[:w[i]-1]) + "…"
			}
			cells = append(cells, c+strings.Repeat(" ", w[i]-utf8.RuneCountInString(c)))
		}
		lines = append(lines, strings.TrimRight(strings.Join(cells, "  "), " "))
	}
	return lines
}

// printWide prints every column of tasks, River's job and the process included.
func printWide(w io.Writer, tasks []etlcontext.Task, n notes) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tSTATUS\tATTEMPT\tJOB\tWAITING\tCHILDREN\tHOST\tPID\tLOCKED\tRUNTIME\tLATEST EVENT\tPROGRESS\tREASON")
	for _, t := range tasks {
		latest := "-"
		if t.LatestEventType != nil {
			latest = *t.LatestEventType
			if t.LatestEventAt != nil {
				latest += " " + localTime(*t.LatestEventAt, n.now)
			}
		}
		progress := bar(t.Progress, 20)
		if eta, ok := n.eta(t); ok {
			progress += " " + eta
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\n",
			t.ID, t.Kind, shownText(t.Queue), t.Status, t.Attempt, t.MaxAttempts,
			orDash(t.JobState), waiting(t), t.Children.String(), shownText(orDash(t.Host)), intOrDash(t.PID), t.InitialEventLocked,
			n.ranFor(t), shownText(latest), progress, n.reason(t))
	}
	return tw.Flush()
}

// reason says in a few words why a task is where it is (etlcontext.Reason).
func reason(t etlcontext.Task, tr etlcontext.Trouble, now time.Time) string {
	return shownText(etlcontext.ReasonOf(t, tr, now).Format(now, func(at time.Time) string { return localTime(at, now) }))
}

// columns is how wide a table for w may be: a terminal's width, else
// $COLUMNS, else 0 (no bound).
func columns(w io.Writer) int {
	if cols, _, tty := terminalSize(w); tty {
		return cols
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 0
}

// localTime writes t in the local zone, named: its time of day when it is
// of now's day, else its date too.
func localTime(t, now time.Time) string {
	t, now = t.Local(), now.Local()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format(time.TimeOnly + " MST")
	}
	return zoned(t)
}

// zoned writes t in the local zone, named: 2026-12-07 18:35:48 UTC.
func zoned(t time.Time) string { return t.Local().Format(time.DateTime + " MST") }

// waiting says what a task that has not started waits for, or until when.
func waiting(t etlcontext.Task) string {
	switch {
	case t.Status != etlcontext.StatusQueued && t.Status != etlcontext.StatusRetrying:
		return "-"
	case t.WaitingFor != nil:
		return *t.WaitingFor
	case t.DueAt != nil && t.DueAt.After(time.Now()):
		return "until " + zoned(*t.DueAt)
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
