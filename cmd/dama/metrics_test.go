package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

const metricsConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
queues:
  etl: { max_running: 10 }
  held: { max_running: 10 }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    retry: {delay: 200ms, backoff: fixed}
  fragile:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 1
  timed:
    queue: etl
    command: ["{{sample}}"]
    timeout: 1s
    on_timeout: fail
  parked:
    queue: held
    command: ["{{sample}}"]
`

// scrape is a parsed /metrics page.
type scrape map[string]*dto.MetricFamily

var metricsURLRE = regexp.MustCompile(`http://[^ "]+/metrics`)

// startWithMetrics starts a supervisor serving metrics on a free port and
// returns it with its metrics' URL.
func startWithMetrics(t *testing.T, env *testenv.Env, cfg string) (*testenv.Proc, string) {
	t.Helper()
	p := env.Start(cfg, "supervisor", "--metrics-listen", "127.0.0.1:0")
	out := waitForLog(t, p, "serving metrics")
	return p, metricsURLRE.FindString(out)
}

func getMetrics(t *testing.T, url string) scrape {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return families
}

// value returns the value of the metric name with the given labels
// ("k=v,k=v"), -1 when there is none; for a histogram, its count.
func (s scrape) value(name, labels string) float64 {
	f := s[name]
	if f == nil {
		return -1
	}
	want := map[string]string{}
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			want[k] = v
		}
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// TestMetrics: a supervisor's /metrics counts the attempts it started and
// settled, by outcome, the tasks it finished and their run time, and
// reads the database's statistics; the next supervisor counts what it
// adopts and the lock it finds lost.
func TestMetrics(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(metricsConfig)
	w := &world{Env: env}
	first, url := startWithMetrics(t, env, cfg)

	submit := func(kind string, args string) int64 {
		t.Helper()
		res := env.Dama(cfg, "submit", kind, "--args", args)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	done := submit("sample", sampleArgs(t, 3, 50, nil))
	retried := submit("sample", sampleArgs(t, 3, 50, map[string]any{"fail_at": 2}))
	failed := submit("fragile", sampleArgs(t, 3, 50, map[string]any{"fail_at": 1}))
	// These two run until they time out or are cancelled.
	hold := map[string]any{"until_file": filepath.Join(env.Dir, "release")}
	timedOut := submit("timed", sampleArgs(t, 1, 100, hold))
	cancelled := submit("sample", sampleArgs(t, 1, 100, hold))
	if res := env.Dama(cfg, "pause", "held"); res.Code != 0 {
		t.Fatalf("pause: %s", res.Stderr)
	}
	submit("parked", "{}")
	submit("parked", "{}")
	w.waitFor(cancelled, 30*time.Second, "to run", func(t etlcontext.Task) bool { return t.Status == etlcontext.StatusRunning && t.InitialEventLocked })
	if res := env.Dama(cfg, "cancel", strconv.FormatInt(cancelled, 10)); res.Code != 0 {
		t.Fatalf("cancel: %s", res.Stderr)
	}
	for _, id := range []int64{done, retried, failed, timedOut, cancelled} {
		w.waitFor(id, time.Minute, "to finish with its job settled", func(t etlcontext.Task) bool {
			return t.Status.Finished() && !t.InitialEventLocked && t.JobState != nil &&
				(*t.JobState == "completed" || *t.JobState == "cancelled" || *t.JobState == "discarded")
		})
	}

	m := getMetrics(t, url)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"dama_attempts_started_total", "kind=sample,queue=etl", 4}, // done, retried twice, cancelled
		{"dama_attempts_failed_total", "kind=sample,reason=error", 1},
		{"dama_attempts_failed_total", "kind=fragile,reason=error", 1},
		{"dama_attempts_failed_total", "kind=timed,reason=timed_out", 1},
		{"dama_tasks_finished_total", "kind=sample,status=DONE", 2},
		{"dama_tasks_finished_total", "kind=sample,status=CANCELLED", 1},
		{"dama_tasks_finished_total", "kind=fragile,status=FAILED", 1},
		{"dama_tasks_finished_total", "kind=timed,status=FAILED", 1},
		{"dama_task_run_seconds", "kind=sample,status=DONE", 2},
		{"dama_submit_to_lock_seconds", "kind=sample", 3},
		{"dama_tasks", "kind=parked,queue=held,status=QUEUED", 2},
		{"dama_tasks_finished_24h", "kind=sample,status=DONE", 2},
		{"dama_queue_paused", "queue=held", 1},
		{"dama_queue_paused", "queue=etl", 0},
		{"dama_stats_up", "", 1},
		// Created at 0, so that the first failure shows in increase().
		{"dama_tasks_finished_total", "kind=parked,status=FAILED", 0},
	} {
		if got := m.value(c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := m.value("dama_queue_oldest_waiting_seconds", "kind=parked"); got <= 0 {
		t.Errorf("dama_queue_oldest_waiting_seconds{kind=parked} = %v, want above 0", got)
	}
	if got := m.value("dama_pool_max_connections", ""); got <= 0 {
		t.Errorf("dama_pool_max_connections = %v, want the pool's size", got)
	}

	// A redeploy: the first supervisor is killed with four tasks running;
	// three task processes die meanwhile, one of them on its last attempt
	// and one with its cancellation requested. The next adopts the four
	// and records the dead attempts' lost locks, the task that is FAILED
	// for it and the one CANCELLED.
	// They run until the test has read the next supervisor's metrics,
	// however long its start takes.
	steady := submit("sample", sampleArgs(t, 1, 100, hold))
	doomed := submit("sample", sampleArgs(t, 1, 100, hold))
	lastChance := submit("fragile", sampleArgs(t, 1, 100, hold))
	unwanted := submit("sample", sampleArgs(t, 1, 100, hold))
	var killed []int
	for _, id := range []int64{steady, doomed, lastChance, unwanted} {
		got := w.waitFor(id, 30*time.Second, "to run", func(t etlcontext.Task) bool {
			return t.Status == etlcontext.StatusRunning && t.InitialEventLocked && t.PID != nil
		})
		if id != steady {
			killed = append(killed, *got.PID)
		}
	}
	first.Kill(t, syscall.SIGKILL)
	waitExit(t, first)
	for _, pid := range killed {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	// With no supervisor to record it, the cancellation is only requested:
	// the wait ends at its deadline, long enough for the request on a
	// stalled host (5 s was not, in a --slow run).
	if res := env.Dama(cfg, "cancel", strconv.FormatInt(unwanted, 10), "--wait", "20s"); res.Code != 22 {
		t.Fatalf("cancel with no supervisor: exit %d, %s; want 22, the cancellation requested", res.Code, res.Stderr)
	}
	_, url = startWithMetrics(t, env, cfg)
	w.waitFor(doomed, time.Minute, "to run a second attempt", func(t etlcontext.Task) bool { return t.Attempt == 2 && t.Status == etlcontext.StatusRunning })
	// The step that launched it counts the attempt once it hears the task
	// process hold its lock, a moment after the database says so.
	want := []struct {
		name, labels string
		want         float64
	}{
		{"dama_adopted_tasks", "kind=sample,queue=etl", 3},
		{"dama_adopted_tasks", "kind=fragile,queue=etl", 1},
		{"dama_lock_losses_total", "kind=sample", 2},
		{"dama_tasks_finished_total", "kind=sample,status=CANCELLED", 1},
		{"dama_lock_losses_total", "kind=fragile", 1},
		{"dama_attempts_failed_total", "kind=sample,reason=lock_lost", 1},
		{"dama_tasks_finished_total", "kind=fragile,status=FAILED", 1},
		{"dama_task_run_seconds", "kind=fragile,status=FAILED", 1},
		{"dama_attempts_started_total", "kind=sample", 1},
	}
	testenv.Eventually(t, 30*time.Second, "the next supervisor's metrics", func() (bool, error) {
		m = getMetrics(t, url)
		for _, c := range want {
			if got := m.value(c.name, c.labels); got != c.want {
				return false, fmt.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
		return true, nil
	})
	t.Logf("the next supervisor adopted %v+%v running tasks, found %v+%v locks lost, counted %v task FAILED by its death, and started %v attempt",
		m.value("dama_adopted_tasks", "kind=sample"), m.value("dama_adopted_tasks", "kind=fragile"),
		m.value("dama_lock_losses_total", "kind=sample"), m.value("dama_lock_losses_total", "kind=fragile"),
		m.value("dama_tasks_finished_total", "kind=fragile,status=FAILED"), m.value("dama_attempts_started_total", "kind=sample"))
}

// TestMetricsListenRefusesABadAddress: a bad --metrics-listen is an error
// before the supervisor starts anything.
func TestMetricsListenRefusesABadAddress(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(metricsConfig)
	res := env.Dama(cfg, "supervisor", "--metrics-listen", "9464")
	if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || !strings.Contains(res.Stderr, "listen address") {
		t.Errorf("--metrics-listen 9464: exit %d, stderr %q: want one line refusing the address", res.Code, res.Stderr)
	}
}
