package taskrunner

import (
	"strings"
	"testing"
)

func TestDecodeLine(t *testing.T) {
	cases := []struct {
		line, suffix, payload, problem string
	}{
		{`{"type":"progress","payload":{"step":1}}`, "PROGRESS", `{"step":1}`, ""},
		{`{"type":"checkpoint","payload":{"next":2}}`, "CHECKPOINT", `{"next":2}`, ""},
		{`{"type":"rows_loaded","payload":42}`, "ROWS_LOADED", `42`, ""},
		{`{"type":"heartbeat"}`, "HEARTBEAT", ``, ""},
		{`not json`, "WARNING", ``, "malformed event line"},
		{`{"type":"progress"} {"type":"x"}`, "WARNING", ``, "more than one JSON value"},
		{`{"type":"progress","extra":1}`, "WARNING", ``, "unknown field"},
		{`{"type":"final"}`, "WARNING", ``, "reserved"},
		{`{"type":"INITIAL"}`, "WARNING", ``, "reserved"},
		{`{"type":"cancel_requested","payload":{"by":"alice"}}`, "WARNING", ``, "reserved"},
		{`{"type":"bad type!"}`, "WARNING", ``, "want letters"},
		{`{"type":""}`, "WARNING", ``, "want letters"},
		{`{"type":"checkpoint","payload":"` + strings.Repeat("c", MaxEnvPayload) + `"}`, "WARNING", ``, "previous checkpoint stands"},
	}
	for _, c := range cases {
		got := decodeLine([]byte(c.line))
		if got.suffix != c.suffix || string(got.payload) != c.payload {
			t.Errorf("%s: got %s %s, want %s %s", c.line, got.suffix, got.payload, c.suffix, c.payload)
		}
		if c.problem != "" {
			meta, _ := got.meta.(map[string]any)
			if p, _ := meta["problem"].(string); !strings.Contains(p, c.problem) {
				t.Errorf("%s: problem %q, want it to mention %q", c.line, p, c.problem)
			}
		}
	}
}

func TestDecodeFailureLine(t *testing.T) {
	cases := []struct {
		line, err string
		retry     *bool
		problem   string
	}{
		{line: `{"type":"failure","payload":{"error":"disk full"}}`, err: "disk full"},
		{line: `{"type":"FAILURE","payload":{"error":"bad row","retry":false}}`, err: "bad row", retry: new(false)},
		{line: `{"type":"failure","payload":{"error":"` + strings.Repeat("é", MaxFailureError) + `"}}`, err: strings.Repeat("é", MaxFailureError/2)},
		{line: `{"type":"failure"}`, problem: "failure: want"},
		{line: `{"type":"failure","payload":{"error":""}}`, problem: "error is required"},
		{line: `{"type":"failure","payload":{"error":"x","why":1}}`, problem: "unknown field"},
	}
	for _, c := range cases {
		got := decodeLine([]byte(c.line))
		if c.problem != "" {
			meta, _ := got.meta.(map[string]any)
			if p, _ := meta["problem"].(string); got.failure != nil || !strings.Contains(p, c.problem) {
				t.Errorf("%.80s: failure %+v, problem %q: want a WARNING mentioning %q", c.line, got.failure, p, c.problem)
			}
			continue
		}
		if got.failure == nil || got.failure.Error != c.err || (got.failure.Retry == nil) != (c.retry == nil) ||
			(c.retry != nil && *got.failure.Retry != *c.retry) {
			t.Errorf("%.80s: got %+v, want error %.40q retry %v", c.line, got.failure, c.err, c.retry)
		}
	}
}

func TestLaunchArgsRoundTrip(t *testing.T) {
	want := Launch{ContextID: 42, RunID: "r-1", LockMode: "advisory", ReadyFD: 3}
	args := want.Args()
	if args[0] != Subcommand {
		t.Fatalf("args %v: want %s first", args, Subcommand)
	}
	got, err := ParseLaunch(args[1:])
	if err != nil || got != want {
		t.Errorf("ParseLaunch(%v) = %+v, %v: want %+v", args[1:], got, err, want)
	}
	// What a v0.1.0 supervisor passes to the binary at its path, which may
	// be this release's after a redeploy.
	v010 := []string{"--context-id", "42", "--run-id", "r-1", "--lock-mode", "advisory", "--ready-fd", "3"}
	if got, err := ParseLaunch(v010); err != nil || got != want {
		t.Errorf("ParseLaunch(%v) = %+v, %v: want %+v", v010, got, err, want)
	}
	for _, bad := range [][]string{
		{"--run-id", "r"},
		{"--context-id", "1"},
		{"--context-id", "1", "--run-id", "r", "--lock-mode", "table"},
		{"--context-id", "1", "--run-id", "r", "extra"},
		{"--context-id", "x", "--run-id", "r"},
	} {
		if _, err := ParseLaunch(bad); err == nil {
			t.Errorf("ParseLaunch(%v): no error", bad)
		}
	}
}

func TestReadEventsSkipsOversizedLinesAndGoesOn(t *testing.T) {
	input := `{"type":"progress","payload":1}` + "\n" +
		strings.Repeat("x", MaxEventLine+10) + "\n" +
		"\n" +
		`{"type":"progress","payload":2}` + "\n" +
		`{"type":"progress","payload":3}` // no final newline
	out := make(chan reported, 10)
	if err := readEvents(strings.NewReader(input), out); err != nil {
		t.Fatal(err)
	}
	close(out)
	var got []string
	for r := range out {
		got = append(got, r.suffix+":"+string(r.payload))
	}
	want := []string{"PROGRESS:1", "WARNING:", "PROGRESS:2", "PROGRESS:3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v, want %v", got, want)
	}
}

func FuzzDecodeLine(f *testing.F) {
	f.Add([]byte(`{"type":"progress","payload":{"a":1}}`))
	f.Add([]byte(`{"type":"final"}`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, line []byte) {
		r := decodeLine(line)
		if r.child != nil || r.failure != nil {
			return // directives, not events
		}
		if !suffixRE.MatchString(r.suffix) || reservedSuffixes[r.suffix] {
			t.Fatalf("line %q decoded to suffix %q", line, r.suffix)
		}
	})
}
