package main

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// treeConfig has a parent kind whose command submits three children on its
// events pipe and awaits them, and one that also submits a child that fails.
// The queue etl runs one task at a time: a parent awaiting its children
// must not hold that slot.
const treeConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 1 }
  wide: { max_running: 5 }
kinds:
  mapper:
    queue: etl
    await_children: true
    children: [piece]
    command: ["/bin/sh", "-c", "for i in 1 2 3; do printf '{\"type\":\"submit\",\"payload\":{\"kind\":\"piece\",\"idempotency_key\":\"part-%s\",\"args\":{\"steps\":4,\"step_ms\":250,\"starts_dir\":\"{{dir}}/starts\"}}}\n' $i >&3; done"]
  failing_mapper:
    queue: etl
    await_children: true
    children: [slow, bad]
    max_attempts: 3
    command: ["/bin/sh", "-c", "printf '{\"type\":\"submit\",\"payload\":{\"kind\":\"slow\",\"args\":{\"steps\":8,\"step_ms\":250,\"until_file\":\"{{dir}}/release\"}}}\n{\"type\":\"submit\",\"payload\":{\"kind\":\"bad\"}}\n' >&3"]
  sloppy_mapper:
    queue: etl
    await_children: true
    command: ["/bin/sh", "-c", "printf '{\"type\":\"submit\",\"payload\":{\"kind\":\"nosuchkind\"}}\n' >&3"]
  piece:
    queue: etl
    command: ["{{sample}}"]
  slow:
    queue: wide
    command: ["{{sample}}"]
  bad:
    queue: wide
    max_attempts: 1
    command: ["/bin/sh", "-c", "exit 1"]
`

func submittedID(t *testing.T, out string) int64 {
	t.Helper()
	id, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("submit printed %q, want an id", out)
	}
	return id
}

// eventTypes returns the types of context id's events in order.
func (w *world) eventTypes(id int64) []string {
	w.T.Helper()
	evs, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		w.T.Fatal(err)
	}
	types := make([]string, len(evs))
	for i, e := range evs {
		types[i] = e.Type
	}
	return types
}

// children returns the children of context parent, oldest first.
func (w *world) children(parent int64) []etlcontext.Task {
	w.T.Helper()
	tasks, err := etlcontext.Tasks(context.Background(), w.Pool, etlcontext.TaskQuery{ParentID: parent})
	if err != nil {
		w.T.Fatal(err)
	}
	for i, j := 0, len(tasks)-1; i < j; i, j = i+1, j-1 {
		tasks[i], tasks[j] = tasks[j], tasks[i]
	}
	return tasks
}

// A task's command submits three children on its events pipe; its kind
// awaits them: the task stays RUNNING, its lock held, until the last child
// is DONE, and is DONE then.
func TestAwaitChildren(t *testing.T) { testenv.LockModes(t, testAwaitChildren) }

func testAwaitChildren(t *testing.T) {
	w, _ := queueWorld(t, treeConfig)
	w.Start(w.cfg, "supervisor")
	res := w.Dama(w.cfg, "submit", "mapper")
	if res.Code != 0 {
		t.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
	}
	parent := submittedID(t, res.Stdout)

	// The children may all finish before a look sees the parent await them
	// (a plain run's did): then its events and the times say it waited.
	awaiting := w.waitFor(parent, 30*time.Second, "to await its children, or finish", func(t etlcontext.Task) bool {
		return t.Status.Finished() || (t.LatestEventType != nil && strings.HasSuffix(*t.LatestEventType, ":"+protocol.EventAwaiting))
	})
	if !awaiting.Status.Finished() && (awaiting.Status != etlcontext.StatusRunning || !awaiting.InitialEventLocked || awaiting.Children.Pending() == 0) {
		t.Errorf("awaiting parent: %s, locked %t, children %v: want RUNNING, locked, children pending", awaiting.Status, awaiting.InitialEventLocked, awaiting.Children)
	}
	done := w.waitSettled(parent, 60*time.Second)
	kids := w.children(parent)
	if done.Status != etlcontext.StatusDone || done.Attempt != 1 || len(kids) != 3 || done.Children[etlcontext.StatusDone] != 3 {
		t.Fatalf("parent %s at attempt %d with %d children %v: want DONE at 1 with 3 DONE children", done.Status, done.Attempt, len(kids), done.Children)
	}
	ids := make([]int64, len(kids))
	for i, k := range kids {
		ids[i] = k.ID
		if k.Status != etlcontext.StatusDone || k.FinishedAt.After(*done.FinishedAt) {
			t.Errorf("child %d: %s, finished %v, after its parent (%v)", k.ID, k.Status, k.FinishedAt, done.FinishedAt)
		}
		if want := "dama:child:" + strconv.FormatInt(parent, 10) + ":part-"; k.IdempotencyKey == nil || !strings.HasPrefix(*k.IdempotencyKey, want) {
			t.Errorf("child %d has key %v, want %s…", k.ID, deref(k.IdempotencyKey), want)
		}
	}
	w.startedOnce(ids)
	types := w.eventTypes(parent)
	if n := countLines(strings.Join(types, "\n"), "mapper:SUBMITTED"); n != 3 || !slices.Contains(types, "mapper:"+protocol.EventAwaiting) || types[len(types)-1] != "mapper:FINAL" {
		t.Errorf("parent events %v: want 3 SUBMITTED, AWAITING and FINAL last", types)
	}
	out := w.Dama(w.cfg, "status", "-o", "wide", strconv.FormatInt(parent, 10))
	if lineWith(out.Stdout, "mapper", "DONE", "3/3 done") == "" {
		t.Errorf("dama status:\n%s", out.Stdout)
	}
	t.Logf("parent DONE %v after its last child", done.FinishedAt.Sub(*kids[len(kids)-1].FinishedAt).Round(time.Millisecond))
}

// A child that fails for good fails its awaiting parent for good at once,
// whatever attempts the parent has left; a child of an unknown kind is
// refused, recorded as a WARNING, and fails its awaiting parent too.
func TestFailedChildFailsItsParent(t *testing.T) { testenv.LockModes(t, testFailedChildFailsItsParent) }

func testFailedChildFailsItsParent(t *testing.T) {
	w, _ := queueWorld(t, treeConfig)
	w.Start(w.cfg, "supervisor")
	res := w.Dama(w.cfg, "submit", "failing_mapper")
	if res.Code != 0 {
		t.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
	}
	parent := submittedID(t, res.Stdout)
	got := w.waitFinished(parent, 60*time.Second)
	if got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
		t.Fatalf("parent %s at attempt %d: want FAILED at 1", got.Status, got.Attempt)
	}
	kids := w.children(parent)
	if len(kids) != 2 {
		t.Fatalf("%d children, want 2", len(kids))
	}
	if kids[0].Status.Finished() {
		t.Errorf("the slow child was %s when its parent failed: want the parent to fail as soon as one child failed", kids[0].Status)
	}
	// The slow child runs until now.
	w.release()
	w.waitSettled(kids[0].ID, 60*time.Second)

	res = w.Dama(w.cfg, "submit", "sloppy_mapper")
	if res.Code != 0 {
		t.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
	}
	sloppy := submittedID(t, res.Stdout)
	if got := w.waitFinished(sloppy, 60*time.Second); got.Status != etlcontext.StatusFailed || got.Attempt != 1 || len(w.children(sloppy)) != 0 {
		t.Fatalf("parent of a refused child: %s at attempt %d: want FAILED at 1, with no child", got.Status, got.Attempt)
	}
	for _, id := range []int64{parent, sloppy} {
		evs, err := etlcontext.Events(context.Background(), w.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		var warned, finalError bool
		for _, e := range evs {
			switch {
			case strings.HasSuffix(e.Type, ":WARNING"):
				warned = warned || strings.Contains(string(e.Meta), "nosuchkind")
			case strings.HasSuffix(e.Type, ":ERROR"):
				var p map[string]any
				_ = json.Unmarshal(e.Payload, &p)
				finalError = p["retry"] == false
			}
		}
		if !finalError || (id == sloppy) != warned {
			t.Errorf("context %d: WARNING for the unknown kind %t, ERROR with retry false %t", id, warned, finalError)
		}
	}
}
