package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/internal/etlcontext"
)

func newStatusCommand() *cobra.Command {
	var (
		asJSON   bool
		limit    int
		statuses []string
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show tasks from data_manager.dama_task_queue",
		Long: `Show tasks from data_manager.dama_task_queue, newest first: one task by ID,
or the newest --limit tasks, optionally only those in the given --status.`,
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
				return watchTasks(cmd.Context(), pool, q, cmd.OutOrStdout(), interval)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if id != 0 {
					return enc.Encode(tasks[0])
				}
				return enc.Encode(tasks)
			}
			return printTasks(cmd.Context(), pool, out, tasks)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&limit, "limit", 50, "show at most this many tasks, newest first (0: all)")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "show only tasks in these statuses (QUEUED,RUNNING,...)")
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw the table, with progress bars, every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often --watch redraws")
	return cmd
}

// printTasks prints tasks as a table: progress as a bar with a
// percentage and, for a running task, the time it has left at its pace;
// durations as people write them (3h12m), times in the local zone.
func printTasks(ctx context.Context, db etlcontext.DB, w io.Writer, tasks []etlcontext.Task) error {
	var running []int64
	for _, t := range tasks {
		if t.Status == etlcontext.StatusRunning {
			running = append(running, t.ID)
		}
	}
	paces := map[int64]etlcontext.Pace{}
	if len(running) > 0 {
		var err error
		if paces, err = etlcontext.Paces(ctx, db, running); err != nil {
			return err
		}
	}
	now := time.Now()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tSTATUS\tATTEMPT\tJOB\tWAITING\tCHILDREN\tHOST\tPID\tLOCKED\tRUNTIME\tLATEST EVENT\tPROGRESS")
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n",
			t.ID, t.Kind, t.Queue, t.Status, t.Attempt, t.MaxAttempts,
			orDash(t.JobState), waiting(t), children(t.Children), orDash(t.Host), intOrDash(t.PID), t.InitialEventLocked,
			ranFor(t, pace, running, now), latest, shown)
	}
	return tw.Flush()
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

// children summarizes a task's children: how many are DONE of how many,
// and how many did not end DONE.
func children(c etlcontext.Children) string {
	if len(c) == 0 {
		return "-"
	}
	total := 0
	for _, n := range c {
		total += n
	}
	s := fmt.Sprintf("%d/%d done", c[etlcontext.StatusDone], total)
	if f := c.Failed(); f > 0 {
		s += fmt.Sprintf(", %d failed", f)
	}
	return s
}

// waiting says why a task that has not started waits: until when it is
// due, or for what.
func waiting(t etlcontext.Task) string {
	switch {
	case t.Status != etlcontext.StatusQueued && t.Status != etlcontext.StatusRetrying:
		return "-"
	case t.WaitingFor != nil:
		return *t.WaitingFor
	case t.Status == etlcontext.StatusQueued && t.DueAt != nil && t.DueAt.After(time.Now()):
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
