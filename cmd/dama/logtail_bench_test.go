package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// BenchmarkLogTail measures what keeping each attempt's log tail in the
// database costs (docs/performance.md "Log tails"): 5 tasks each writing
// log lines as fast as a shell loop does, for DAMA_BENCH_WINDOW (60s), with
// log_tail_bytes at its default (1 MiB, every 5s) and, as the baseline, -1
// (no tail kept). It reports the output written and the database's growth
// per minute, the chunks written per minute, what each task keeps, and the
// task processes' median RSS. Run it with scripts/bench.sh logs.
func BenchmarkLogTail(b *testing.B) {
	window := benchWindow(b)
	for _, keep := range []string{"1048576", "-1"} {
		b.Run("log_tail_bytes="+keep, func(b *testing.B) {
			for range b.N {
				measureLogTail(b, keep, window)
			}
		})
	}
}

func measureLogTail(b *testing.B, keep string, window time.Duration) {
	const tasks = 5
	env := testenv.New(b)
	goFile := filepath.Join(env.Dir, "go")
	script := `i=0; while [ ! -e ` + goFile + ` ]; do
  i=$((i+1)); printf 'line %d of a task that writes its log as fast as a shell loop can, 100 bytes or so ...........\n' $i
done`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
log_tail_bytes: ` + keep + `
queues:
  default: { max_running: 10 }
kinds:
  verbose:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	ctx := context.Background()
	before, start := dbSize(b, env), time.Now()
	b.ResetTimer()
	var ids []int64
	for range tasks {
		ids = append(ids, w.submitOf("verbose"))
	}
	var pids []int
	for _, id := range ids {
		pids = append(pids, *w.waitRunning(id).PID)
	}
	rss := sampleRSS(b, window, pids)
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	ran := time.Since(start)
	b.StopTimer()
	var written int64
	for _, id := range ids {
		w.waitSettled(id, time.Minute)
		info, err := os.Stat(filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id)))
		if err != nil {
			b.Fatal(err)
		}
		written += info.Size()
	}
	var chunks, kept int64
	if err := env.Pool.QueryRow(ctx, `
		SELECT (SELECT coalesce(n_tup_ins, 0) FROM pg_stat_user_tables WHERE relid = 'data_manager.log_chunks'::regclass),
		       (SELECT coalesce(sum(octet_length(data)), 0) FROM data_manager.log_chunks)`).Scan(&chunks, &kept); err != nil {
		b.Fatal(err)
	}
	perMin := func(n float64) float64 { return n / ran.Minutes() }
	b.ReportMetric(perMin(float64(written)/(1<<20)), "out-MB/min")
	b.ReportMetric(perMin(float64(chunks)), "chunks/min")
	b.ReportMetric(float64(kept)/tasks/(1<<10), "KB-kept/task")
	b.ReportMetric(float64(dbSize(b, env)-before)/(1<<20)/ran.Minutes(), "DB-MB/min")
	b.Logf("log_tail_bytes %s: %d tasks wrote %.0f MB of log in %s; %d chunks written, %.0f KB kept a task; their task processes' median RSS at each fifth of the window: %s MB",
		keep, tasks, float64(written)/(1<<20), ran.Round(time.Second), chunks, float64(kept)/tasks/(1<<10), strings.Join(rss, ", "))
}
