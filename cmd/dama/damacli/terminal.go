package damacli

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// Exit codes of `dama submit --wait` once the task is submitted, beside 0
// for DONE, and of `dama cancel`: apart from 1 (dama's own errors, before
// anything is written) and 2 (a Go program's crash).
const (
	exitTaskFailed    = 20
	exitTaskCancelled = 21
	// exitTaskUnknown: the task was submitted, and the wait ended before
	// it was finished (interrupted, or the database refused to answer).
	exitTaskUnknown = 22
	// exitCancelPending is dama cancel's: the wait ended after the
	// cancellation was requested and before it was recorded. The task
	// goes on until it is surely stopped, then it is CANCELLED.
	exitCancelPending = 22
)

// settleWait bounds how long a finished task's wait goes on for its task
// process to release its lock and its River job to be settled.
const settleWait = 10 * time.Second

// ANSI sequences for a terminal: clear the line, clear the screen.
const (
	clearLine   = "\r\033[K"
	clearScreen = "\033[H\033[2J"
)

// terminalSize returns w's columns and rows, and whether it is a terminal
// (as x/term reads them on Linux).
func terminalSize(w io.Writer) (cols, rows int, ok bool) {
	f, isFile := w.(*os.File)
	if !isFile {
		return 0, 0, false
	}
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return 0, 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 || ws.Row == 0 {
		return 80, 24, true
	}
	return int(ws.Col), int(ws.Row), true
}

// fit cuts s to fit n columns (one per rune), so that a redrawn line never
// wraps onto a row the next redraw would not clear.
func fit(s string, n int) string {
	if r := []rune(s); len(r) > max(n, 0) {
		return string(r[:max(n, 0)])
	}
	return s
}

// bar draws progress as "[#######.............] 35% 7/20", or shows the
// payload itself when it is not one of the forms dama reads.
func bar(payload []byte, width int) string {
	if len(payload) == 0 {
		return "-"
	}
	p, ok := etlcontext.ParseProgress(payload)
	if !ok {
		return shownText(string(payload))
	}
	filled := int(p.Fraction*float64(width) + 0.5)
	s := "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]" + fmt.Sprintf(" %3.0f%%", p.Fraction*100)
	if !strings.HasSuffix(p.Label, "%") {
		s += " " + shownText(p.Label)
	}
	return s
}

// describe is one line on where a task is: status, attempt, why (its
// reason, "-" for none), progress.
func describe(t etlcontext.Task, why string) string {
	s := fmt.Sprintf("task %d %s %s attempt %d/%d", t.ID, t.Kind, t.Status, t.Attempt, t.MaxAttempts)
	if why != "-" {
		s += " (" + why + ")"
	}
	if t.LatestEventType != nil && protocol.EventSuffix(*t.LatestEventType) == protocol.EventAwaiting && t.Status == etlcontext.StatusRunning {
		s += " awaiting children: " + t.Children.String()
	} else if len(t.Children) > 0 {
		s += " children: " + t.Children.String()
	}
	if len(t.Progress) > 0 {
		s += " " + bar(t.Progress, 20)
	}
	return s
}

// waitForTask follows task id until it is finished, drawing its progress
// on w: redrawn in place every 250ms on a terminal, else a line per change
// of status or attempt. The end is heard (client.Wait), not looked for; a
// database that goes away is waited for. A finished task is followed at
// most settleWait longer, until it is settled, so that what the caller
// does next (`dama retry`, `dama logs`) finds it at rest. It returns the
// exit code, with the task's last error for FAILED and CANCELLED.
func waitForTask(ctx context.Context, client *dama.Client, db etlcontext.DB, id int64, w io.Writer) (int, error) {
	cols, _, tty := terminalSize(w)
	interval := time.Second
	if tty {
		interval = 250 * time.Millisecond
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	// Closed once the end is heard, or the wait failed: either way the
	// looks below then come at once, until the task is at rest.
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = client.Wait(waitCtx, id)
	}()
	var (
		last     string
		failing  error
		finished time.Time
	)
	// newline ends the line a terminal's redraws share.
	newline := func() {
		if tty && last != "" {
			fmt.Fprintln(w)
		}
	}
	defer newline()
	for {
		tasks, err := etlcontext.Tasks(ctx, db, etlcontext.TaskQuery{ID: id})
		switch {
		case ctx.Err() != nil:
			return exitTaskUnknown, fmt.Errorf("stopped waiting; task %d goes on", id)
		case err != nil && !etlcontext.Transient(err):
			return exitTaskUnknown, fmt.Errorf("follow task %d: %w", id, err)
		case err != nil:
			if failing == nil {
				newline()
				fmt.Fprintf(w, "waiting for the database: %v\n", err)
				last = ""
			}
			failing = err
		case len(tasks) == 0:
			return exitTaskUnknown, fmt.Errorf("task %d not found", id)
		default:
			failing = nil
			t := tasks[0]
			why := "-"
			if t.Status == etlcontext.StatusQueued || t.Status == etlcontext.StatusRetrying {
				// What it waits for, or the error it is retried after.
				if tr, err := etlcontext.Troubles(ctx, db, []int64{t.ID}); err == nil {
					why = reason(t, tr[t.ID], time.Now())
				}
			}
			line := describe(t, why)
			key := fmt.Sprintf("%s %d", t.Status, t.Attempt)
			switch {
			case tty:
				fmt.Fprint(w, clearLine+fit(line, cols-1))
			case last != key:
				fmt.Fprintln(w, line)
			}
			last = key
			if t.Status.Finished() {
				if finished.IsZero() {
					finished = time.Now()
				}
				if settled(t) || time.Since(finished) > settleWait {
					return outcome(ctx, db, t)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-ended:
			ended = nil
		case <-time.After(interval):
		}
	}
}

// settled reports whether a finished task is at rest: no process holds its
// lock, and its River job is in a final state.
func settled(t etlcontext.Task) bool {
	return !t.InitialEventLocked && (t.JobState == nil || slices.Contains([]string{"completed", "cancelled", "discarded"}, *t.JobState))
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
	f, err := etlcontext.LastFailure(ctx, db, t.ID, t.Kind)
	if err != nil {
		return code, fmt.Errorf("task %d %s at attempt %d/%d (%w)", t.ID, t.Status, t.Attempt, t.MaxAttempts, err)
	}
	// The command's words, printed on the user's terminal.
	reason := cmp.Or(shownText(f.Reason), "no reason recorded")
	return code, fmt.Errorf("task %d %s at attempt %d/%d: %s", t.ID, t.Status, t.Attempt, t.MaxAttempts, reason)
}

// watchTasks prints the tasks q selects every interval until ctx ends:
// redrawn in place on a terminal, else a table after another, each under
// a line with the time.
func watchTasks(ctx context.Context, db etlcontext.DB, q etlcontext.TaskQuery, w io.Writer, interval time.Duration, wide bool) error {
	for {
		cols, rows, tty := terminalSize(w)
		var buf bytes.Buffer
		now := zoned(time.Now())
		var table bytes.Buffer
		tasks, err := etlcontext.Tasks(ctx, db, q)
		if err == nil {
			width := 0
			if tty && !wide {
				width = cols - 1
			}
			err = printTasks(ctx, db, &table, tasks, wide, width)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !etlcontext.Transient(err):
			return err
		case err != nil:
			table.Reset()
			fmt.Fprintf(&table, "waiting for the database: %v\n", err)
		}
		if tty {
			// A screen's worth, each line within its width: the header
			// must not scroll off, nor a line wrap.
			buf.WriteString(clearScreen)
			fmt.Fprintf(&buf, "%s\n\n", fit(fmt.Sprintf("dama status, every %s, at %s (Ctrl-C to stop)", interval, now), cols-1))
			lines := strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n")
			if len(lines) > rows-3 {
				lines = append(lines[:max(rows-4, 1)], fmt.Sprintf("... %d more", len(lines)-max(rows-4, 1)))
			}
			for i := range lines {
				lines[i] = fit(lines[i], cols-1)
			}
			buf.WriteString(strings.Join(lines, "\n"))
		} else {
			fmt.Fprintf(&buf, "--- %s\n%s\n", now, table.String())
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
