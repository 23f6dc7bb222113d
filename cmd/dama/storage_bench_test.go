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

	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
)

// BenchmarkProgressStorage measures what chatty tasks store (docs/performance.md
// "Storage"): 5 tasks each reporting progress 50 times a second (a line
// every DAMA_BENCH_LINE_GAP seconds, 0.02, plus the shell's own time) for
// DAMA_BENCH_WINDOW (60s), with progress_interval at its default (10s) and,
// as the baseline, at 1ms (every line stored, as before sampling). It
// reports the lines reported and the events stored per minute, and the
// database's growth. Run it with scripts/bench.sh storage.
func BenchmarkProgressStorage(b *testing.B) {
	window := benchWindow(b)
	gap := "0.02"
	if v := os.Getenv("DAMA_BENCH_LINE_GAP"); v != "" {
		if _, err := strconv.ParseFloat(v, 64); err != nil {
			b.Fatalf("DAMA_BENCH_LINE_GAP: want seconds, such as 0.002: %v", err)
		}
		gap = v
	}
	for _, interval := range []string{"10s", "1ms"} {
		b.Run("progress_interval="+interval, func(b *testing.B) {
			for range b.N {
				measureStorage(b, interval, window, gap)
			}
		})
	}
}

func measureStorage(b *testing.B, interval string, window time.Duration, gap string) {
	const tasks = 5
	env := testenv.New(b)
	goFile := filepath.Join(env.Dir, "go")
	// A line every gap seconds until goFile exists; then the count of
	// lines written goes to lines-<id>.
	script := `i=0; while [ ! -e ` + goFile + ` ]; do
  i=$((i+1)); printf '{"type":"progress","payload":{"step":%d,"of":1000000}}\n' $i >&3; sleep ` + gap + `
done
echo $i > "$0/lines-$DAMA_ETL_CONTEXT_ID"`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
progress_interval: ` + interval + `
queues:
  default: { max_running: 10 }
kinds:
  chatty:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `, "{{dir}}"]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	ctx := context.Background()
	// From before the first submission: the lines and events counted are
	// the tasks' whole lives'.
	before, start := dbSize(b, env), time.Now()
	b.ResetTimer()
	var ids []int64
	for range tasks {
		ids = append(ids, w.submitOf("chatty"))
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
	var lines int64
	for _, id := range ids {
		w.waitSettled(id, time.Minute)
		data, err := os.ReadFile(filepath.Join(env.Dir, fmt.Sprintf("lines-%d", id)))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		lines += n
	}
	var events int64
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.event_store WHERE type = 'chatty:PROGRESS'`).Scan(&events); err != nil {
		b.Fatal(err)
	}
	perMin := func(n int64) float64 { return float64(n) / ran.Minutes() }
	b.ReportMetric(perMin(lines), "lines/min")
	b.ReportMetric(perMin(events), "events/min")
	b.ReportMetric(float64(dbSize(b, env)-before)/(1<<20)/ran.Minutes(), "MB/min")
	b.Logf("progress_interval %s: %d tasks reported %d progress lines in %s; %d PROGRESS events stored; their task processes' median RSS at each fifth of the window: %s MB",
		interval, tasks, lines, ran.Round(time.Second), events, strings.Join(rss, ", "))
}

// benchWindow is how long a benchmark's tasks run: DAMA_BENCH_WINDOW, 60s
// by default.
func benchWindow(b *testing.B) time.Duration {
	v := os.Getenv("DAMA_BENCH_WINDOW")
	if v == "" {
		return time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("DAMA_BENCH_WINDOW: %v", err)
	}
	return d
}

// dbSize is the size of env's database.
func dbSize(b *testing.B, env *testenv.Env) int64 {
	var n int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// sampleRSS waits out window, the time measured (not a wait for a
// condition), and reads the median resident set (RSS) and proportional set
// (PSS: what the host spends on them) of the processes pids at each fifth
// of it: a task process relaying a steady stream must not grow. It
// reports the first and the last as metrics, and returns the five RSS, in
// MB.
func sampleRSS(b *testing.B, window time.Duration, pids []int) []string {
	var rss []string
	median := func(read func(int) (int64, error)) float64 {
		var mb []float64
		for _, pid := range pids {
			if n, err := read(pid); err == nil {
				mb = append(mb, float64(n)/(1<<20))
			}
		}
		return scalebench.Median(mb)
	}
	for i := range 5 {
		time.Sleep(window / 5) // deliberately: a fifth of the measured window
		med, pss := median(scalebench.RSS), median(scalebench.PSS)
		rss = append(rss, fmt.Sprintf("%.1f", med))
		if i == 0 {
			b.ReportMetric(med, "MB-RSS-first")
			b.ReportMetric(pss, "MB-PSS-first")
		}
		if i == 4 {
			b.ReportMetric(med, "MB-RSS-last")
			b.ReportMetric(pss, "MB-PSS-last")
		}
	}
	return rss
}
