package task_test

import (
	"strings"
	"testing"

	"github.com/dama-etl/dama/task"
)

// TestReportsTheTaskProcessWouldRefuseAreRefusedAtOnce: what the task
// process would only record as a WARNING (a checkpoint too large as the
// database gives it back, a child it would not submit) fails the call
// instead, and writes nothing.
func TestReportsTheTaskProcessWouldRefuseAreRefusedAtOnce(t *testing.T) {
	read := taskProcess()
	tk, err := task.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := task.FromEnv(); again != tk {
		t.Error("FromEnv gave a second Task: two would own one pipe")
	}
	// 80 KB as written, 120 KB as jsonb prints it ("1, 1, ...").
	ones := make([]int, 40000)
	for i := range ones {
		ones[i] = 1
	}
	for what, err := range map[string]error{
		"checkpoint":              tk.Checkpoint(ones),
		"checkpoint by its name":  tk.Event("checkpoint", ones),
		"child's arguments":       tk.Submit("c", ones, ""),
		"child without a kind":    tk.Submit("", nil, ""),
		"key over 512 bytes":      tk.Submit("c", nil, strings.Repeat("k", 513)),
		"key of dama's own":       tk.Submit("c", nil, "auto:1"),
		"key that is not UTF-8":   tk.Submit("c", nil, "a\xff"),
		"key with NUL":            tk.Submit("c", nil, "a\x00"),
		"a type dama writes":      tk.Event("final", nil),
		"a type that is no type":  tk.Event("no such type", nil),
		"a directive as an event": tk.Event("submit", nil),
	} {
		if err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	if err := tk.Fail("", false); err != nil {
		t.Fatal(err)
	}
	if err := tk.Submit("c", nil, "a.csv"); err != nil {
		t.Fatal(err)
	}
	lines := read(2)
	want := []string{
		`{"type":"failure","payload":{"error":"(no reason given)","retry":false}}`,
		`{"type":"submit","payload":{"kind":"c","args":null,"idempotency_key":"a.csv"}}`,
	}
	for i := range want {
		if i >= len(lines) || lines[i] != want[i] {
			t.Fatalf("lines written %q, want %q (and nothing of the refused reports)", lines, want)
		}
	}
}
