package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
)

// Exit codes of `dama submit --wait` for a task that did not end DONE.
const (
	exitTaskFailed    = 2
	exitTaskCancelled = 3
)

// ANSI sequences for a terminal: clear the line, clear the screen.
const (
	clearLine   = "\r\033[K"
	clearScreen = "\033[H\033[2J"
)

// isTerminal reports whether w is a terminal (as x/term does on Linux).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// bar draws progress as "[#######.............] 35% 7/20", or the payload
// itself when it is not one of the forms dama reads.
func bar(payload []byte, width int) string {
	if len(payload) == 0 {
		return "-"
	}
	p, ok := etlcontext.ParseProgress(payload)
	if !ok {
		return string(payload)
	}
	filled := int(p.Fraction*float64(width) + 0.5)
	s := "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]" + fmt.Sprintf(" %3.0f%%", p.Fraction*100)
	if !strings.HasSuffix(p.Label, "%") {
		s += " " + p.Label
	}
	return s
}

// describe is one line on where a task is: status, attempt, progress.
func describe(t etlcontext.Task) string {
	s := fmt.Sprintf("task %d %s %s attempt %d/%d", t.ID, t.Kind, t.Status, t.Attempt, t.MaxAttempts)
	if w := waiting(t); w != "-" {
		s += " (waiting: " + w + ")"
	}
	if t.LatestEventType != nil && strings.HasSuffix(*t.LatestEventType, ":"+etlcontext.EventAwaiting) && t.Status == etlcontext.StatusRunning {
		s += " awaiting children: " + children(t.Children)
	} else if len(t.Children) > 0 {
		s += " children: " + children(t.Children)
	}
	if len(t.Progress) > 0 {
		s += " " + bar(t.Progress, 20)
	}
	return s
}

// waitForTask follows task id until it is finished, drawing its progress
// on w: redrawn in place on a terminal, a line per change of status or
// attempt otherwise. A database that goes away is waited for. It returns
// the exit code: 0 for DONE, exitTaskFailed or exitTaskCancelled with the
// last error as the error.
func waitForTask(ctx context.Context, db etlcontext.DB, id int64, w io.Writer, interval time.Duration) (int, error) {
	tty := isTerminal(w)
	var (
		last    string
		failing error
	)
	for {
		tasks, err := etlcontext.Tasks(ctx, db, etlcontext.TaskQuery{ID: id})
		switch {
		case ctx.Err() != nil:
			if tty {
				fmt.Fprintln(w)
			}
			return 1, fmt.Errorf("stopped waiting; task %d goes on", id)
		case err != nil:
			if failing == nil {
				prefix := ""
				if tty {
					prefix = clearLine
				}
				fmt.Fprintf(w, "%swaiting for the database: %v\n", prefix, err)
			}
			failing = err
		case len(tasks) == 0:
			return 1, fmt.Errorf("etl context %d not found", id)
		default:
			failing = nil
			t := tasks[0]
			line := describe(t)
			switch {
			case tty:
				fmt.Fprint(w, clearLine+line)
			case last != fmt.Sprintf("%s %d", t.Status, t.Attempt):
				fmt.Fprintln(w, line)
			}
			last = fmt.Sprintf("%s %d", t.Status, t.Attempt)
			if t.Status.Finished() {
				if tty {
					fmt.Fprintln(w)
				}
				return outcome(ctx, db, t)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// outcome is the exit code and error of a finished task.
func outcome(ctx context.Context, db etlcontext.DB, t etlcontext.Task) (int, error) {
	if t.Status == etlcontext.StatusDone {
		return 0, nil
	}
	code := exitTaskFailed
	if t.Status == etlcontext.StatusCancelled {
		code = exitTaskCancelled
	}
	_, reason, err := etlcontext.LastFailure(ctx, db, t.ID, t.Kind)
	if err != nil {
		return code, fmt.Errorf("task %d %s at attempt %d/%d (%w)", t.ID, t.Status, t.Attempt, t.MaxAttempts, err)
	}
	if reason == "" {
		reason = "no reason recorded"
	}
	return code, fmt.Errorf("task %d %s at attempt %d/%d: %s", t.ID, t.Status, t.Attempt, t.MaxAttempts, reason)
}

// watchTasks prints the tasks q selects every interval until ctx ends:
// redrawn in place, with progress bars, on a terminal; a table after
// another, each under a line with the time, otherwise.
func watchTasks(ctx context.Context, db etlcontext.DB, q etlcontext.TaskQuery, w io.Writer, interval time.Duration) error {
	tty := isTerminal(w)
	for {
		var buf bytes.Buffer
		now := time.Now().Format(time.DateTime)
		tasks, err := etlcontext.Tasks(ctx, db, q)
		if ctx.Err() != nil {
			return nil
		}
		if tty {
			buf.WriteString(clearScreen)
			fmt.Fprintf(&buf, "dama status, every %s, at %s (Ctrl-C to stop)\n\n", interval, now)
		} else {
			fmt.Fprintf(&buf, "--- %s\n", now)
		}
		if err != nil {
			fmt.Fprintf(&buf, "waiting for the database: %v\n", err)
		} else if err := printTaskTable(&buf, tasks, func(p []byte) string { return bar(p, 20) }); err != nil {
			return err
		}
		if !tty {
			buf.WriteString("\n")
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
