package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
)

func TestParseAppliesDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(`
log_dir: /var/lib/dama/logs
kinds:
  conflation:
    command: ["/opt/etl/conflation", "--verbose"]
`))
	if err != nil {
		t.Fatal(err)
	}
	k, ok := cfg.Kind("conflation")
	if !ok {
		t.Fatal("kind conflation missing")
	}
	if k.Queue != config.DefaultQueue || k.MaxAttempts != config.DefaultMaxAttempts {
		t.Errorf("kind defaults: queue %q, max_attempts %d", k.Queue, k.MaxAttempts)
	}
	if q := cfg.Queues[config.DefaultQueue]; q.MaxRunning != config.DefaultMaxRunning {
		t.Errorf("default queue max_running %d", q.MaxRunning)
	}
	if cfg.PollInterval.D() != config.DefaultPollInterval || cfg.HeartbeatInterval.D() != config.DefaultHeartbeatInterval || cfg.KillGrace.D() != config.DefaultKillGrace {
		t.Errorf("interval defaults: %v %v %v", cfg.PollInterval.D(), cfg.HeartbeatInterval.D(), cfg.KillGrace.D())
	}
}

func TestParseRejectsBadConfigurations(t *testing.T) {
	cases := map[string]struct{ yaml, want string }{
		"no log_dir":        {"kinds: {a: {command: [x]}}", "log_dir is required"},
		"no kinds":          {"log_dir: /l", "no kinds"},
		"empty command":     {"log_dir: /l\nkinds: {a: {command: []}}", "command is required"},
		"unknown queue":     {"log_dir: /l\nkinds: {a: {command: [x], queue: q}}", "queue q is not in queues"},
		"misspelt key":      {"log_dir: /l\npoll_intervall: 5s\nkinds: {a: {command: [x]}}", "poll_intervall"},
		"bad duration":      {"log_dir: /l\npoll_interval: soon\nkinds: {a: {command: [x]}}", "soon"},
		"tiny poll":         {"log_dir: /l\npoll_interval: 1ms\nkinds: {a: {command: [x]}}", "at least 100ms"},
		"bad kind name":     {"log_dir: /l\nkinds: {'a b': {command: [x]}}", "kind name"},
		"negative running":  {"log_dir: /l\nqueues: {q: {max_running: -1}}\nkinds: {a: {command: [x], queue: q}}", "must not be negative"},
		"not YAML":          {"log_dir: [", "parse YAML"},
		"negative kind max": {"log_dir: /l\nkinds: {a: {command: [x], max_running: -2}}", "max_running must not be negative"},
		"per key, no key":   {"log_dir: /l\nkinds: {a: {command: [x], max_running_per_key: 2}}", "needs concurrency_key"},
		"empty key part":    {"log_dir: /l\nkinds: {a: {command: [x], concurrency_key: 'a..b'}}", "concurrency_key"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error mentioning %q", err, c.want)
			}
		})
	}
}

func TestLoadResolvesPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dama.yaml")
	if err := os.WriteFile(path, []byte("log_dir: logs\npoll_interval: 2s\nkinds: {a: {command: [x]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != path || cfg.LogDir != filepath.Join(dir, "logs") || cfg.PollInterval.D() != 2*time.Second {
		t.Errorf("path %q, log_dir %q, poll %v", cfg.Path, cfg.LogDir, cfg.PollInterval.D())
	}
	if _, err := config.Load(""); err == nil || !strings.Contains(err.Error(), "DAMA_CONFIG") {
		t.Errorf("Load(\"\"): %v", err)
	}
}

func TestLockModeDefaultsAndValidation(t *testing.T) {
	cfg, err := config.Parse([]byte("log_dir: /l\nkinds: {a: {command: [x]}, b: {command: [y], lock_mode: advisory}}"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := cfg.Kind("a")
	b, _ := cfg.Kind("b")
	if cfg.LockMode != config.LockModeRow || cfg.LockModeOf(a) != config.LockModeRow || cfg.LockModeOf(b) != config.LockModeAdvisory {
		t.Errorf("lock modes: config %q, a %q, b %q", cfg.LockMode, cfg.LockModeOf(a), cfg.LockModeOf(b))
	}
	// A hand-built configuration behaves like a parsed one.
	if got := (&config.Config{}).LockModeOf(config.Kind{}); got != config.LockModeRow {
		t.Errorf("hand-built config: lock mode %q, want row", got)
	}
	for _, bad := range []string{
		"log_dir: /l\nlock_mode: rows\nkinds: {a: {command: [x]}}",
		"log_dir: /l\nkinds: {a: {command: [x], lock_mode: Advisory}}",
	} {
		if _, err := config.Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "lock_mode") {
			t.Errorf("%q: got %v, want a lock_mode error", bad, err)
		}
	}
}

func TestConcurrencyKey(t *testing.T) {
	cfg, err := config.Parse([]byte("log_dir: /l\nkinds: {a: {command: [x], concurrency_key: source.region}, b: {command: [y]}}"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := cfg.Kind("a")
	if a.MaxRunningPerKey != config.DefaultMaxRunningPerKey {
		t.Errorf("max_running_per_key %d, want the default %d", a.MaxRunningPerKey, config.DefaultMaxRunningPerKey)
	}
	for args, want := range map[string]string{
		`{"source": {"region": "eu-west"}}`:            "eu-west",
		`{"source": {"region": 12345678901234567890}}`: "12345678901234567890",
		`{"source": {"region": {"b": 1, "a": 2}}}`:     `{"a":2,"b":1}`,
	} {
		got, err := a.ConcurrencyKeyOf([]byte(args))
		if err != nil || got == nil || *got != want {
			t.Errorf("ConcurrencyKeyOf(%s) = %v, %v; want %q", args, got, err, want)
		}
	}
	for _, args := range []string{`{}`, `{"source": "eu"}`, `{"source": {"region": null}}`, ``} {
		if got, err := a.ConcurrencyKeyOf([]byte(args)); err == nil {
			t.Errorf("ConcurrencyKeyOf(%s) = %v, want an error naming the field", args, *got)
		}
	}
	b, _ := cfg.Kind("b")
	if got, err := b.ConcurrencyKeyOf([]byte(`{"region": "eu"}`)); got != nil || err != nil {
		t.Errorf("a kind without concurrency_key: %v, %v", got, err)
	}
}
