package supervisor_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// metric reads the metric name{kind} from reg; nil when it has none.
func metric(t *testing.T, reg *prometheus.Registry, name, kind string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m
				}
			}
		}
	}
	return nil
}

// counterValue reads the counter name{kind}; -1 when there is none.
func counterValue(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	if m := metric(t, reg, name, kind); m != nil {
		return m.GetCounter().GetValue()
	}
	return -1
}

// histogramCount reads the sample count of the histogram name{kind}.
func histogramCount(t *testing.T, reg *prometheus.Registry, name, kind string) uint64 {
	t.Helper()
	if m := metric(t, reg, name, kind); m != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

// TestAttemptStartedAfterTheLaunchTimeout: a runner that takes its lock
// only after the supervisor stopped waiting for it (here: a launch timeout
// of 1 ms) is still counted in dama_attempts_started_total, once.
func TestAttemptStartedAfterTheLaunchTimeout(t *testing.T) {
	env := testenv.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 200ms
kinds:
  late:
    command: ["/bin/sleep", "0.5"]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sup, err := supervisor.New(env.Pool, cfg, supervisor.Options{
		DatabaseURL:   env.URL,
		Executable:    env.DamaBin,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		LaunchTimeout: time.Millisecond,
		Registerer:    reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Error(err)
		}
	}()
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "late"})
	if err != nil {
		t.Fatal(err)
	}
	env.WaitForTask(id, 30*time.Second, "DONE", func(t etlcontext.Task) bool { return t.Status == etlcontext.StatusDone })
	testenv.Eventually(t, 10*time.Second, "the attempt counted", func() (bool, error) {
		return counterValue(t, reg, "dama_attempts_started_total", "late") == 1, nil
	})
	env.WaitForTask(id, 30*time.Second, "with its job completed", func(t etlcontext.Task) bool {
		return t.JobState != nil && *t.JobState == "completed"
	})
	if got := counterValue(t, reg, "dama_attempts_started_total", "late"); got != 1 {
		t.Errorf("dama_attempts_started_total{kind=late} = %v once the job completed, want 1", got)
	}
	if got := histogramCount(t, reg, "dama_submit_to_lock_seconds", "late"); got != 1 {
		t.Errorf("dama_submit_to_lock_seconds{kind=late} has %d samples, want 1", got)
	}
	if got := env.Task(id); got.Attempt != 1 {
		t.Errorf("task %d DONE at attempt %d, want 1", id, got.Attempt)
	}
}
