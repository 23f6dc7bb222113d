package etlcontext_test

import (
	"bytes"
	"context"
	"github.com/dama-etl/dama/protocol"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// jsonbAccepts reports whether the server takes data as jsonb, and why not.
func jsonbAccepts(pool *pgxpool.Pool, data []byte) error {
	var ok bool
	return pool.QueryRow(context.Background(), `SELECT $1::text::jsonb IS NOT NULL`, string(data)).Scan(&ok)
}

func TestCleanJSONReplacesWhatJSONBRefuses(t *testing.T) {
	env := testenv.New(t)
	for _, tc := range []struct {
		in, want string
		replaced etlcontext.Replaced
	}{
		{in: `{"a": "x\u0000y"}`, want: `{"a": "x\ufffdy"}`, replaced: etlcontext.Replaced{NUL: 1}},
		{in: `{"\u0000": 1}`, want: `{"\ufffd": 1}`, replaced: etlcontext.Replaced{NUL: 1}},
		{in: "\"a\xffb\xfe\xfdc\"", want: `"a\ufffdb\ufffdc"`, replaced: etlcontext.Replaced{InvalidUTF8: 2}},
		{in: "\"\xed\xa0\x80\"", want: `"\ufffd"`, replaced: etlcontext.Replaced{InvalidUTF8: 1}}, // a surrogate encoded in UTF-8
		{in: `["\ud800", "\udc00", "\ud83d\ude00", "\ud800\u0041"]`, want: `["\ufffd", "\ufffd", "\ud83d\ude00", "\ufffd\u0041"]`, replaced: etlcontext.Replaced{Surrogates: 3}},
		{in: `[1e131072, 1e131071, -1e-16384, 1e-16383, 0.5, 1e99999999999999999999, 0.5e200000, 1e60, 1e70]`, want: `["1e131072", "1e131071", "-1e-16384", "1e-16383", 0.5, "1e99999999999999999999", "0.5e200000", 1e60, "1e70"]`, replaced: etlcontext.Replaced{Numbers: 4, Huge: 3}},
		{in: `{"step": 3, "of": 10, "note": "caf\u00e9 \\u0000 ok"}`, want: `{"step": 3, "of": 10, "note": "caf\u00e9 \\u0000 ok"}`},
	} {
		got, r, err := etlcontext.CleanJSON([]byte(tc.in))
		if err != nil || string(got) != tc.want || r != tc.replaced {
			t.Errorf("CleanJSON(%q) = %s, %+v, %v; want %s, %+v", tc.in, got, r, err, tc.want, tc.replaced)
		}
		if err := jsonbAccepts(env.Pool, got); err != nil {
			t.Errorf("jsonb refuses CleanJSON(%q) = %s: %v", tc.in, got, err)
		}
	}
	if _, _, err := etlcontext.CleanJSON([]byte(`{"a": 1} {}`)); err == nil {
		t.Error("CleanJSON accepted two values")
	}
}

func TestCleanText(t *testing.T) {
	got, r := etlcontext.CleanText("ok\x00 \xff\xfe done")
	if got != "ok\ufffd \ufffd done" || r != (etlcontext.Replaced{NUL: 1, InvalidUTF8: 1}) {
		t.Errorf("CleanText = %q, %+v", got, r)
	}
	if r.String() != "1 NUL character, 1 invalid UTF-8 sequence" {
		t.Errorf("String() = %q", r.String())
	}
}

// Whatever bytes a command reports, the cleaned value is stored, and a
// value jsonb already took is left as it was.
func FuzzCleanJSON(f *testing.F) {
	env := testenv.New(f)
	for _, seed := range []string{
		`{"step": 3, "of": 10}`, `{"a": "x\u0000y"}`, "\"\xff\"", `"\ud800"`, `"\udbff\udfff"`,
		`1e131072`, `-0.0e-16383`, `[0.000e-16381]`, `0.5e200000`, `0.0001e131080`, `0.0001e131076`, `00012e131069`, `[1e131071]`, `[0,0,0,0]`, `{"a":-0,"b":1.50,"c":"\u00e9\/"}`, `{"k": [true, null, "\\\"\u00e9"]}`, `123456789e131064`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, r, err := etlcontext.CleanJSON(in)
		if err != nil {
			return
		}
		if !r.Any() && !bytes.Equal(out, in) {
			t.Fatalf("CleanJSON(%q) changed it to %q but reports nothing replaced", in, out)
		}
		if err := jsonbAccepts(env.Pool, out); err != nil {
			t.Fatalf("jsonb refuses CleanJSON(%q) = %q (%+v): %v", in, out, r, err)
		}
		// Huge numbers are replaced for reading back far longer than
		// written; anything else only where jsonb refuses the value.
		if r.Refused() && jsonbAccepts(env.Pool, in) == nil {
			t.Fatalf("CleanJSON(%q) replaced %s in a value jsonb accepts", in, r)
		}
		var printed int
		if err := env.Pool.QueryRow(context.Background(), `SELECT octet_length($1::text::jsonb::text)`, string(out)).Scan(&printed); err != nil {
			t.Fatal(err)
		}
		if est := protocol.JSONBTextLen(out); printed > est {
			t.Fatalf("jsonb prints %q in %d bytes; JSONBTextLen says %d", out, printed, est)
		}
		if printed > 2*len(out)+64 {
			t.Fatalf("jsonb prints %q in %d bytes, far more than its %d", out, printed, len(out))
		}
	})
}
