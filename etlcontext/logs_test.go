package etlcontext_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// A run's output is kept as a rolling tail: chunks appended, those out of
// the last keep bytes dropped, a chunk written again kept once (the
// longer), only while the run is the running one, within the bounds the
// Go side writes by; a launch taken back leaves nothing of its output to
// the next run of its attempt number; and LogSince reads it back in
// order, each byte once.
func TestTheLogTailRolls(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	taken := env.Launch(id)
	if err := etlcontext.AppendLog(ctx, env.Pool, id, taken.ID, 0, []byte("a launch taken back\n"), 100); err != nil {
		t.Fatal(err)
	}
	// The same attempt's number, by another run.
	c, err := etlcontext.Get(ctx, env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := etlcontext.AbandonLaunch(ctx, env.Pool, c); err != nil {
		t.Fatal(err)
	}
	run := env.Launch(id)
	if err := etlcontext.AppendLog(ctx, env.Pool, id, taken.ID, 20, []byte("late\n"), 100); !errors.Is(err, etlcontext.ErrStaleRun) {
		t.Errorf("a write of a run that is not the running one: %v, want ErrStaleRun", err)
	}
	write := func(start int, data string) {
		t.Helper()
		if err := etlcontext.AppendLog(ctx, env.Pool, id, run.ID, int64(start), []byte(data), 10); err != nil {
			t.Fatalf("append %q at %d: %v", data, start, err)
		}
	}
	write(0, "0123")
	write(4, "45")
	write(4, "4567") // the write before made again, longer
	write(4, "45")   // and again, shorter: the longer stays
	write(8, "89abcdef")
	pieces, err := etlcontext.LogSince(ctx, env.Pool, id, etlcontext.LogPos{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for _, p := range pieces {
		got.Write(p.Data)
	}
	// Keep 10 of 16 bytes: the chunks that end before byte 6 go.
	if len(pieces) != 1 || pieces[0].Attempt != 1 || pieces[0].Offset != 4 || got.String() != "456789abcdef" {
		t.Errorf("the tail: %d pieces from %+v, %q; want one from 1:4, 456789abcdef", len(pieces), pieces, got.String())
	}
	from, err := etlcontext.LogSince(ctx, env.Pool, id, etlcontext.LogPos{Attempt: 1, Offset: 10}, 1<<20)
	if err != nil || len(from) != 1 || string(from[0].Data) != "abcdef" {
		t.Errorf("the tail from 1:10: %+v (%v), want abcdef", from, err)
	}
	if end, err := etlcontext.LogEnd(ctx, env.Pool, id); err != nil || end != (etlcontext.LogPos{Attempt: 1, Offset: 16}) {
		t.Errorf("the tail's end: %+v (%v), want 1:16", end, err)
	}

	// Backwards is refused; a byte at a time grows one row.
	if err := etlcontext.AppendLog(ctx, env.Pool, id, run.ID, 2, []byte("x"), 10); !errors.Is(err, etlcontext.ErrRefused) {
		t.Errorf("a chunk before the last one kept: %v, want ErrRefused", err)
	}
	for i := range 100 {
		if err := etlcontext.AppendLog(ctx, env.Pool, id, run.ID, int64(16+i), []byte("."), 1000); err != nil {
			t.Fatal(err)
		}
	}
	var rows int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.log_chunks WHERE etl_context_id = $1`, id).Scan(&rows); err != nil || rows != 2 {
		t.Errorf("after 100 writes of a byte: %d rows (%v), want 2: the last one grown by each", rows, err)
	}

	// The bounds: what an attempt keeps, and one chunk.
	for _, c := range []struct {
		what  string
		chunk int
		keep  int64
		ok    bool
	}{
		{"the largest keep", 1, config.MaxLogTailBytes, true},
		{"a keep past the largest", 1, config.MaxLogTailBytes + 1, false},
		{"the largest chunk", protocol.MaxLogChunk, 10, true},
		{"a chunk past the largest", protocol.MaxLogChunk + 1, 10, false},
		{"a negative keep", 1, -1, false},
	} {
		err := etlcontext.AppendLog(ctx, env.Pool, id, run.ID, 10000, []byte(strings.Repeat("x", c.chunk)), c.keep)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, etlcontext.ErrRefused)) {
			t.Errorf("%s: %v, want accepted %v (else ErrRefused)", c.what, err, c.ok)
		}
	}
}
