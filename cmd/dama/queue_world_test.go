package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
)

// queueWorld is a world whose configuration the test writes, with a Go
// client for submitting many tasks quickly.
func queueWorld(t *testing.T, body string) (*world, *dama.Client) {
	t.Helper()
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(body), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, client
}

// submitKind submits a sample task of kind with extra arguments through the
// Go API and returns its id.
func (w *world) submitKind(client *dama.Client, kind string, steps, stepMS int, extra map[string]any) int64 {
	w.T.Helper()
	args := map[string]any{"steps": steps, "step_ms": stepMS, "starts_dir": w.startsDir}
	for k, v := range extra {
		args[k] = v
	}
	raw, _ := json.Marshal(args)
	id, _, err := client.Submit(context.Background(), dama.SubmitParams{Kind: kind, Args: raw})
	if err != nil {
		w.T.Fatal(err)
	}
	return id
}

// startedOnce fails the test unless every context in ids started exactly
// once.
func (w *world) startedOnce(ids []int64) {
	w.T.Helper()
	for _, id := range ids {
		if starts := w.starts(id); len(starts) != 1 {
			w.T.Errorf("context %d started %d times: %v", id, len(starts), starts)
		}
	}
}

// sampler records, every few milliseconds until stop, the most tasks seen
// RUNNING at once per group that query returns (group text, count).
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  map[string]int
	err  error
}

func (w *world) sample(query string) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), max: map[string]int{}}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			rows, err := w.Pool.Query(context.Background(), query)
			if err == nil {
				for rows.Next() {
					var (
						group string
						n     int
					)
					if err = rows.Scan(&group, &n); err != nil {
						break
					}
					s.mu.Lock()
					s.max[group] = max(s.max[group], n)
					s.mu.Unlock()
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
			}
			if err != nil {
				s.mu.Lock()
				if s.err == nil {
					s.err = err
				}
				s.mu.Unlock()
				return
			}
		}
	}()
	return s
}

func (s *sampler) finish(t *testing.T) map[string]int {
	t.Helper()
	close(s.stop)
	<-s.done
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.max
}
