package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/dama-etl/dama/cmd/dama/internal/web"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A task's log read from the tail the database keeps comes in pieces of at
// most 64 KiB of output, each saying where output was not kept, whatever
// the pieces stored: one just under the bound followed by a gap, chunks
// that overlap (a write made again), invalid UTF-8.
func TestTheKeptLogIsReadInBoundedPieces(t *testing.T) {
	env := testenv.New(t)
	cfg, err := config.Load(env.WriteConfig("log_dir: {{dir}}/logs\nkinds:\n  sample: { command: [\"true\"] }\n"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := web.New(env.Pool, cfg, web.Options{ReadOnly: true, AllowedHosts: []string{"localhost"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(page)
	t.Cleanup(ts.Close)
	ctx := context.Background()
	id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "sample", Queue: "default", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	a1 := strings.Repeat("a", 64<<10-20)
	for _, c := range []struct {
		attempt int
		start   int
		data    string
	}{
		{1, 0, a1},
		{2, 100, "bbbbbbbbbb\xff\xfebbbbbbbb"}, // its first 100 bytes not kept
		{2, 110, "bbbbbbbb"},                   // within the one before (a write made again)
		{2, 116, "bbbbcc"},                     // overlaps the one before by 4 bytes
		{2, 200, "dd"},                         // after a gap of 78
	} {
		if _, err := env.Pool.Exec(ctx, `INSERT INTO data_manager.log_chunks (etl_context_id, attempt, run_id, start_byte, data)
			VALUES ($1, $2, gen_random_uuid(), $3, $4)`, id, c.attempt, c.start, []byte(c.data)); err != nil {
			t.Fatal(err)
		}
	}
	var text strings.Builder
	next := "0:0"
	for range 10 {
		resp, err := http.Get(fmt.Sprintf("%s/api/tasks/%d/log?offset=%s", ts.URL, id, url.QueryEscape(next)))
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Data   string `json:"data"`
			Next   string `json:"next"`
			Source string `json:"source"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || v.Source != "database" {
			t.Fatalf("GET the log from %s: %d %+v (%v)", next, resp.StatusCode, v, err)
		}
		if len(v.Data) > 64<<10+200 {
			t.Errorf("a piece of %d bytes, want at most 64 KiB and a line", len(v.Data))
		}
		if v.Data == "" {
			break
		}
		text.WriteString(v.Data)
		next = v.Next
	}
	want := a1 + "[dama: attempt 2: its first 100 bytes are not kept]\n" + "bbbbbbbbbb\ufffdbbbbbbbbcc" + "[dama: 78 bytes are not kept]\n" + "dd"
	if got := text.String(); got != want {
		t.Errorf("the log read in pieces ends %q, want it to end %q (and be %d bytes, not %d)", got[max(len(got)-120, 0):], want[len(want)-120:], len(want), len(got))
	}
}
