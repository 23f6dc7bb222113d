package damacli

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dama-etl/dama/etlcontext"
)

func TestLocalTimes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 15, 4, 5, 0, time.Local)
	zone := now.Format("MST")
	if got := localTime(now.Add(-time.Hour).UTC(), now); got != "14:04:05 "+zone {
		t.Errorf("an hour ago: %q, want the local time of day", got)
	}
	if got := localTime(now.AddDate(0, 0, -1).UTC(), now); got != "2026-11-24 15:04:05 "+zone {
		t.Errorf("a day ago: %q, want the local date and time", got)
	}
}

// However narrow, the table keeps the id, the status and the progress,
// and fits when they do.
func TestTheStatusTableFitsItsWidth(t *testing.T) {
	rows := [][]string{
		{"ID", "KIND", "STATUS", "ATTEMPT", "PROGRESS", "TIME", "REASON"},
		{"12345", "conflation", "RUNNING", "1/3", "[#####.....]  50% 5/10", "ETA 3m12s", "-"},
		{"12344", "conflation", "QUEUED", "0/3", "-", "-", "waiting: /opt/etl/conflation not found on host etl-worker-7 since 10:02:11"},
	}
	for cols := 1; cols <= 200; cols++ {
		lines := fitTable(rows, cols)
		if !strings.Contains(lines[0], "PROGRESS") || !strings.Contains(lines[1], "[#####.....]  50% 5/10") || !strings.HasPrefix(lines[2], "12344") {
			t.Fatalf("at %d columns the table lost the progress or the id:\n%s", cols, strings.Join(lines, "\n"))
		}
		for _, line := range lines {
			if n := utf8.RuneCountInString(line); n > cols && cols >= len("ID     STATUS   PROGRESS              ") {
				t.Fatalf("a line of %d runes at %d columns:\n%s", n, cols, strings.Join(lines, "\n"))
			}
		}
	}
	if got := fitTable(rows, 0)[2]; !strings.HasSuffix(got, "since 10:02:11") {
		t.Errorf("unbounded, the reason is cut: %q", got)
	}
}

// A reason is a command's words: its control characters are shown, not
// sent to the terminal.
func TestAReasonCannotWriteToTheTerminal(t *testing.T) {
	task := etlcontext.Task{Status: etlcontext.StatusFailed}
	got := reason(task, etlcontext.Trouble{Error: "boom\x1b[2J\x1b]0;owned\x07\u009b31m\nnext\tline"}, time.Now())
	if want := "boom^[[2J^[]0;owned^G\uFFFD31m next line"; got != want {
		t.Errorf("reason %q, want %q", got, want)
	}
	// A host that a task process named: a carriage return would move the
	// cursor back over the line, a bidi override reverse what follows.
	task.Status = etlcontext.StatusQueued
	got = reason(task, etlcontext.Trouble{Unfit: "x not found", Host: "h1\rFAKE\u202egnp.exe", At: time.Now()}, time.Now())
	if !strings.HasPrefix(got, "waiting: x not found on host h1 FAKE\uFFFDgnp.exe since ") {
		t.Errorf("reason %q: want the carriage return and the override shown", got)
	}
}
