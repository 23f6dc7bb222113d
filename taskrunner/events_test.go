package taskrunner

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
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
		{`{"type":"stalled","payload":{"last_at":"never"}}`, "WARNING", ``, "reserved"},
		{`{"type":"unstalled"}`, "WARNING", ``, "reserved"},
		{`{"type":"bad type!"}`, "WARNING", ``, "want letters"},
		{`{"type":""}`, "WARNING", ``, "want letters"},
		{`{"type":"checkpoint","payload":"` + strings.Repeat("c", protocol.MaxEnvPayload) + `"}`, "WARNING", ``, "previous checkpoint stands"},
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

// TestDecodeSubmitLineOfAnEarlierRelease: a submit line as dama's earlier
// releases wrote it, with "ParentID", submits its child, of the task that
// wrote it whatever the line says.
func TestDecodeSubmitLineOfAnEarlierRelease(t *testing.T) {
	got := decodeLine([]byte(`{"type":"submit","payload":{"ParentID":7,"kind":"c","args":{},"idempotency_key":""}}`))
	if got.child == nil || got.child.Kind != "c" {
		t.Fatalf("got %+v, want the child of kind c", got)
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
		{line: `{"type":"failure","payload":{"error":"` + strings.Repeat("é", protocol.MaxFailureError) + `"}}`, err: strings.Repeat("é", protocol.MaxFailureError/2)},
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

func TestReadEventsSkipsOversizedLinesAndGoesOn(t *testing.T) {
	// The longest line taken is protocol.MaxEventLine bytes, its newline aside.
	longest := `{"type":"progress","payload":"` + strings.Repeat("y", protocol.MaxEventLine-len(`{"type":"progress","payload":""}`)) + `"}`
	input := `{"type":"progress","payload":1}` + "\n" +
		longest + "\n" +
		longest + "z\n" +
		strings.Repeat("x", protocol.MaxEventLine+10) + "\n" +
		"\n" +
		`{"type":"progress","payload":2}` + "\n" +
		`{"type":"progress","payload":3}` // no final newline
	var got []string
	if err := readEvents(strings.NewReader(input), func(r reported) {
		got = append(got, r.suffix+":"+string(r.payload))
	}); err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		got[i] = g[:min(len(g), 12)]
	}
	want := []string{"PROGRESS:1", "PROGRESS:\"yy", "WARNING:", "WARNING:", "PROGRESS:2", "PROGRESS:3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v, want %v", got, want)
	}
}

// No line a command writes may make a write fail: whatever it decodes to
// is taken by the database, once cleaned as the writer cleans it.
func FuzzDecodeLine(f *testing.F) {
	env := testenv.New(f)
	for _, seed := range []string{
		`{"type":"progress","payload":{"a":1}}`, `{"type":"final"}`, "\xff\xfe",
		`{"type":"rows","payload":{"a":"x\u0000y","b\u0000":"\ud800","c":1e999999}}`,
		"{\"type\":\"rows\",\"payload\":\"\xff\"}",
		`{"type":"failure","payload":{"error":"bad\u0000row","retry":false}}`,
		`{"type":"submit","payload":{"kind":"k\u0000","args":{"x":"\udc00"},"idempotency_key":"\u0000"}}`,
		`{"type":"checkpoint","payload":{"next":[1,2,{"deep":null}]}}`,
	} {
		f.Add([]byte(seed))
	}
	stored := func(t *testing.T, line []byte, what string, v any) {
		t.Helper()
		raw, _ := cleanValue(v)
		if raw == nil {
			return
		}
		var ok bool
		if err := env.Pool.QueryRow(context.Background(), `SELECT $1::text::jsonb IS NOT NULL`, string(raw)).Scan(&ok); err != nil {
			t.Fatalf("line %q: the database refuses its %s %q: %v", line, what, raw, err)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r := decodeLine(line)
		switch {
		case r.failure != nil:
			stored(t, line, "failure", map[string]any{"reason": r.failure.Error})
			return
		case r.child != nil:
			stored(t, line, "child", map[string]any{"kind": r.child.Kind, "args": r.child.Args, "key": r.child.IdempotencyKey})
			return
		}
		if !protocol.ValidSuffix(r.suffix) || protocol.Reserved(r.suffix) {
			t.Fatalf("line %q decoded to suffix %q", line, r.suffix)
		}
		stored(t, line, "payload", r.payload)
		stored(t, line, "meta", r.meta)
	})
}

// Lines that would read back larger than written, or pass for JSON with a
// stray bracket, or borrow dama's own child keys, are refused or cleaned.
func TestDecodeLineMeasuresWhatTheDatabaseGivesBack(t *testing.T) {
	zeros := "[" + strings.Repeat("0,", 40000) + "0]" // 80 KB written, 120 KB read back
	cases := []struct{ line, problem, payload string }{
		{line: `{"type":"checkpoint","payload":` + zeros + `}`, problem: "as stored"},
		{line: `{"type":"checkpoint","payload":[1e131071]}`, payload: `["1e131071"]`},
		{line: `{"type":"submit","payload":{"kind":"k","args":{"a":` + zeros + `}}}`, problem: "as stored"},
		{line: `{"type":"submit","payload":{"kind":"k","args":[1]}}`, problem: "must be a JSON object, not an array"},
		{line: `{"type":"submit","payload":{"kind":"k","idempotency_key":"x\u0000y"}}]`, problem: "not one JSON value"},
		{line: `{"type":"submit","payload":{"kind":"k","idempotency_key":"auto:1:2"}}`, problem: "dama's own"},
		{line: `{"type":"submit","payload":{"kind":"k","idempotency_key":"a\u0000"}}`, problem: "only from a clean line"},
		{line: "{\"type\":\"submit\",\"payload\":{\"kind\":\"k\",\"idempotency_key\":\"a\xff\"}}", problem: "only from a clean line"},
		{line: `{"type":"submit","payload":{"kind":"k","idempotency_key":"a","args":{"x":"\ud800"}}}`, problem: "only from a clean line"},
		{line: `{"type":"submit","payload":{"kind":"k","idempotency_key":"` + strings.Repeat("k", protocol.MaxIdempotencyKey+1) + `"}}`, problem: "at most"},
	}
	for _, c := range cases {
		got := decodeLine([]byte(c.line))
		meta, _ := got.meta.(map[string]any)
		p, _ := meta["problem"].(string)
		switch {
		case c.problem != "" && (got.child != nil || !strings.Contains(p, c.problem)):
			t.Errorf("%.60s: child %v, problem %q; want a WARNING mentioning %q", c.line, got.child, p, c.problem)
		case c.payload != "" && string(got.payload) != c.payload:
			t.Errorf("%.60s: payload %s, want %s", c.line, got.payload, c.payload)
		}
	}
}

// plainLine decodes a line it takes as the decoder does.
func FuzzPlainLineIsTheDecoders(f *testing.F) {
	for _, seed := range []string{
		`{"type":"progress","payload":{"step":3,"of":10}}`,
		` { "payload" : [1, "a\"}", {"b": null}] , "type" : "rows_2" } `,
		`{"type":"x"}`, `{"type":"x","payload":null}`, `{"type":"x","type":"y"}`,
		`{"Type":"x"}`, `{"type":"a\u0062"}`, `{"type":1}`, `{"type":"x","payload":"\\"}`,
		`{"type":"x","payload":-1.5e3}`, `{"type":"x","payload":true}`, `{"type":"x","other":1}`, `{}`, `[]`, `"x"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if !json.Valid(line) {
			return
		}
		typ, payload, ok := plainLine(line)
		if !ok {
			return
		}
		var msg struct {
			Type    string          `json:"type"`
			Payload json.RawMessage `json:"payload"`
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&msg); err != nil {
			t.Fatalf("plainLine took %q, which the decoder refuses: %v", line, err)
		}
		if typ != msg.Type || !bytes.Equal(payload, msg.Payload) {
			t.Fatalf("line %q: plainLine read type %q, payload %q; the decoder %q, %q", line, typ, payload, msg.Type, msg.Payload)
		}
	})
}

// plainLine does not panic on bytes that are not JSON.
func TestPlainLineTakesNoBrokenLine(t *testing.T) {
	for _, line := range []string{`{"`, `{"type`, `{"type":`, `{"type":"x`, `{"type":"x",`, `{"type":"x","payload":[`, `{`, ``, `{"a\`} {
		if _, _, ok := plainLine([]byte(line)); ok {
			t.Errorf("plainLine took %q", line)
		}
	}
}
