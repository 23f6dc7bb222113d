package web

import (
	"encoding/json"
	"strings"
	"testing"
)

// A task's read stays within its budget however large its events,
// attempts and children: the oldest of each give way, in that order, and
// the reply says so; the newest attempt stays.
func TestTaskReplyStaysWithinItsBudget(t *testing.T) {
	big := strings.Repeat("<é>", 3000) // 12 KB; '<' is not escaped
	type item struct {
		N    int
		Text string
	}
	many := func(n int) []item {
		out := make([]item, n)
		for i := range out {
			out[i] = item{i, big}
		}
		return out
	}
	for _, c := range []struct {
		name                       string
		events, attempts, children int
		cut                        []string
	}{
		{"small", 3, 2, 1, nil},
		{"events", 200, 2, 1, []string{"events_cut"}},
		{"attempts", 0, 100, 1, []string{"attempts_cut"}},
		{"all", 200, 100, 200, []string{"events_cut", "attempts_cut", "children_cut"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const max = 1 << 20
			b, err := taskReply(map[string]any{"args": map[string]string{"a": big}}, many(c.events), many(c.attempts), many(c.children), max)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > max {
				t.Errorf("%d bytes, want at most %d", len(b), max)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"events_cut", "attempts_cut", "children_cut"} {
				_, said := got[key]
				want := false
				for _, k := range c.cut {
					want = want || k == key
				}
				if said != want {
					t.Errorf("%s said %v, want %v", key, said, want)
				}
			}
			var attempts []item
			if err := json.Unmarshal(got["attempts"], &attempts); err != nil {
				t.Fatal(err)
			}
			if c.attempts > 0 && (len(attempts) == 0 || attempts[len(attempts)-1].N != c.attempts-1) {
				t.Errorf("attempts %d, the newest of them missing", len(attempts))
			}
		})
	}
}
