package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
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
  watched: {command: [x], stall_after: 1s, on_stall: kill}
`))
	if err != nil {
		t.Fatal(err)
	}
	k, ok := cfg.Kind("conflation")
	if !ok {
		t.Fatal("kind conflation missing")
	}
	if k.Queue != config.DefaultQueue || k.MaxAttempts != config.DefaultMaxAttempts || k.StallAfter != 0 || k.OnStall != config.OnStallWarn {
		t.Errorf("kind defaults: queue %q, max_attempts %d, stall_after %s, on_stall %q", k.Queue, k.MaxAttempts, k.StallAfter, k.OnStall)
	}
	if w := cfg.Kinds["watched"]; w.StallAfter != config.Duration(time.Second) || w.OnStall != config.OnStallKill {
		t.Errorf("stall_after %s, on_stall %q: want 1s and kill", w.StallAfter, w.OnStall)
	}
	if q := cfg.Queues[config.DefaultQueue]; q.MaxRunning != config.DefaultMaxRunning {
		t.Errorf("default queue max_running %d", q.MaxRunning)
	}
	if cfg.PollInterval != config.DefaultPollInterval || cfg.HeartbeatInterval != config.DefaultHeartbeatInterval || cfg.KillGrace != config.DefaultKillGrace {
		t.Errorf("interval defaults: %v %v %v", cfg.PollInterval, cfg.HeartbeatInterval, cfg.KillGrace)
	}
}

func TestParseRejectsBadConfigurations(t *testing.T) {
	cases := map[string]struct{ yaml, want string }{
		"no log_dir":           {"kinds: {a: {command: [x]}}", "log_dir is required"},
		"no kinds":             {"log_dir: /l", "no kinds"},
		"empty command":        {"log_dir: /l\nkinds: {a: {command: []}}", "command (or function) is required"},
		"command and func":     {"log_dir: /l\nkinds: {a: {command: [x], function: f}}", "exclude each other"},
		"bad function name":    {"log_dir: /l\nkinds: {a: {function: 'f g'}}", "function name"},
		"function exit codes":  {"log_dir: /l\nkinds: {a: {function: f, fail_on_exit_codes: [3]}}", "NoRetry"},
		"unknown queue":        {"log_dir: /l\nkinds: {a: {command: [x], queue: q}}", "queue q is not in queues"},
		"misspelt key":         {"log_dir: /l\npoll_intervall: 5s\nkinds: {a: {command: [x]}}", "poll_intervall"},
		"bad duration":         {"log_dir: /l\npoll_interval: soon\nkinds: {a: {command: [x]}}", "soon"},
		"tiny poll":            {"log_dir: /l\npoll_interval: 1ms\nkinds: {a: {command: [x]}}", "at least 100ms"},
		"bad kind name":        {"log_dir: /l\nkinds: {'a b': {command: [x]}}", "kind name"},
		"negative running":     {"log_dir: /l\nqueues: {q: {max_running: -1}}\nkinds: {a: {command: [x], queue: q}}", "must not be negative"},
		"not YAML":             {"log_dir: [", "not YAML: line 1"},
		"misspelt, nested":     {"log_dir: /l\nqueues:\n  etl: {max_runing: 4}\nkinds: {a: {command: [x]}}", "line 3: queues.etl.max_runing is not a setting (did you mean queues.etl.max_running?)"},
		"command a string":     {"log_dir: /l\nkinds:\n  a: {command: /bin/true}", `line 3: kinds.a.command: want a list, as ["/opt/etl/tool", "--verbose"], not "/bin/true"`},
		"not a number":         {"log_dir: /l\nkinds: {a: {command: [x], max_attempts: many}}", `line 2: kinds.a.max_attempts: want a whole number, not "many"`},
		"bare duration":        {"log_dir: /l\npoll_interval: 5\nkinds: {a: {command: [x]}}", "line 2: poll_interval: 5 has no unit"},
		"queues a list":        {"log_dir: /l\nqueues: [etl]\nkinds: {a: {command: [x]}}", "line 2: queues: want names, each with its settings"},
		"empty":                {"", "the configuration is empty"},
		"merge, then an error": {"log_dir: /l\nkinds:\n  a: &k {command: [x]}\n  b: {<<: *k, max_attempts: many}", `line 4: kinds.b.max_attempts: want a whole number, not "many"`},
		"negative kind max":    {"log_dir: /l\nkinds: {a: {command: [x], max_running: -2}}", "max_running must not be negative"},
		"per key, no key":      {"log_dir: /l\nkinds: {a: {command: [x], max_running_per_key: 2}}", "needs concurrency_key"},
		"empty key part":       {"log_dir: /l\nkinds: {a: {command: [x], concurrency_key: 'a..b'}}", "concurrency_key"},
		"attempts disagree":    {"log_dir: /l\nkinds: {a: {command: [x], max_attempts: 2, retry: {max_attempts: 3}}}", "disagree"},
		"bad backoff":          {"log_dir: /l\nkinds: {a: {command: [x], retry: {backoff: linear}}}", "retry.backoff"},
		"max below delay":      {"log_dir: /l\nkinds: {a: {command: [x], retry: {delay: 1h, max_delay: 1m}}}", "shorter than"},
		"pass_env odd name":    {"log_dir: /l\nkinds: {a: {command: [x], pass_env: ['A-B']}}", "want a variable name"},
		"pass_env DAMA_":       {"log_dir: /l\nkinds: {a: {command: [x], pass_env: [DAMA_WEB_TOKEN]}}", "dama sets the DAMA_ variables"},
		"pass_env not kept":    {"log_dir: /l\nkinds: {a: {command: [x], pass_env: [HOME]}}", "gets it anyway"},
		"both exit lists":      {"log_dir: /l\nkinds: {a: {command: [x], retry_on_exit_codes: [1], fail_on_exit_codes: [2]}}", "exclude each other"},
		"exit code 0":          {"log_dir: /l\nkinds: {a: {command: [x], fail_on_exit_codes: [0]}}", "exit code 0"},
		"bad on_timeout":       {"log_dir: /l\nkinds: {a: {command: [x], timeout: 1h, on_timeout: ignore}}", "on_timeout"},
		"tiny stall_after":     {"log_dir: /l\nkinds: {a: {command: [x], stall_after: 500ms}}", "stall_after 500ms: want 0 (none), or from 1s to"},
		"negative stall_after": {"log_dir: /l\nkinds: {a: {command: [x], stall_after: -1m}}", "stall_after -1m0s"},
		"bad on_stall":         {"log_dir: /l\nkinds: {a: {command: [x], stall_after: 30m, on_stall: restart}}", `on_stall "restart": want "warn" or "kill"`},
		"kill, no stall_after": {"log_dir: /l\nkinds: {a: {command: [x], on_stall: kill}}", "on_stall kill needs stall_after"},
		"negative kind grace":  {"log_dir: /l\nkinds: {a: {command: [x], kill_grace: -1s}}", "kill_grace"},
		"bad schedule":         {"log_dir: /l\nkinds: {a: {command: [x], schedule: '61 * * * *'}}", "schedule"},
		"every":                {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@every 5m'}}", "@every is not supported"},
		"zone in spec":         {"log_dir: /l\nkinds: {a: {command: [x], schedule: 'CRON_TZ=UTC 0 * * * *'}}", "with timezone"},
		"bad timezone":         {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', timezone: Mars/Olympus}}", "Mars/Olympus"},
		"zone, no schedule":    {"log_dir: /l\nkinds: {a: {command: [x], timezone: UTC}}", "timezone needs schedule"},
		"overlap, no sched":    {"log_dir: /l\nkinds: {a: {command: [x], overlap: allow}}", "overlap needs schedule"},
		"bad runner":           {"log_dir: /l\nkinds: {a: {command: [x], runner: docker}}", `runner "docker": want "host" or "kubernetes"`},
		"pod on a host":        {"log_dir: /l\nkinds: {a: {command: [x], pod: {spec: {}}}}", "pod needs runner: kubernetes"},
		"pod, no template":     {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], runner: kubernetes}}", "needs pod"},
		"pod, a function":      {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {function: f, runner: kubernetes, pod: {spec: {}}}}", "not a function"},
		"pod, a user":          {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], user: etl, runner: kubernetes, pod: {spec: {}}}}", "container's user"},
		"pod, host locks":      {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], lock_mode: host, runner: kubernetes, pod: {spec: {}}}}", "not host"},
		"pod, a list":          {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], runner: kubernetes, pod: [spec]}}", "want a mapping"},
		"start_timeout, host":  {"log_dir: /l\nkinds: {a: {command: [x], start_timeout: 1m}}", "start_timeout needs runner: kubernetes"},
		"negative retention":   {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], runner: kubernetes, pod: {spec: {}}, pod_retention: -1s}}", "pod_retention"},
		"bad overlap":          {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', overlap: replace}}", "overlap"},
		"queue, max 2":         {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', overlap: queue, max_running: 2}}", "one task at a time"},
		"args not a map":       {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', schedule_args: [1]}}", "want a mapping"},
		"impossible date":      {"log_dir: /l\nkinds: {a: {command: [x], schedule: '0 0 30 2 *'}}", "no tick"},
		"memory, no unit":      {"log_dir: /l\nkinds: {a: {command: [x], resources: {memory: 2GB}}}", `line 2: kinds.a.resources.memory: "2GB" is not a size: write one as 512MiB, 2GiB or a number of bytes`},
		"tiny memory":          {"log_dir: /l\nkinds: {a: {command: [x], resources: {memory: 1MiB}}}", "resources.memory 1MiB: at least 4MiB"},
		"negative cpu":         {"log_dir: /l\nresources: {cpu: -1}\nkinds: {a: {command: [x]}}", "resources.cpu -1"},
		"pids a list":          {"log_dir: /l\nkinds: {a: {command: [x], resources: {pids: [1]}}}", "resources.pids"},
		"pod, resources":       {"log_dir: /l\nkubernetes: {image: d}\nkinds: {a: {command: [x], runner: kubernetes, pod: {spec: {}}, resources: {cpu: 1}}}", "a pod's limits are its template's"},
		"cpu NaN":              {"log_dir: /l\nkinds: {a: {command: [x], resources: {cpu: .nan}}}", "resources.cpu NaN"},
		"one pid":              {"log_dir: /l\nkinds: {a: {command: [x], resources: {pids: 1}}}", "resources.pids 1: at least 2"},
		"relative cgroup":      {"log_dir: /l\ncgroup_parent: dama\nkinds: {a: {command: [x]}}", `cgroup_parent "dama": want a control group's absolute path`},
		"args lack the key":    {"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', concurrency_key: region}}", "schedule_args"},
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
	if cfg.Path != path || cfg.LogDir != filepath.Join(dir, "logs") || time.Duration(cfg.PollInterval) != 2*time.Second {
		t.Errorf("path %q, log_dir %q, poll %v", cfg.Path, cfg.LogDir, cfg.PollInterval)
	}
	if _, err := config.Load(""); err == nil || !strings.Contains(err.Error(), "DAMA_CONFIG") {
		t.Errorf("Load(\"\"): %v", err)
	}
}

func TestAKubernetesKindsDefaults(t *testing.T) {
	cfg, err := config.Parse([]byte(`
log_dir: /l
lock_mode: host
user: etl
retention: 48h
kubernetes: {image: registry.example/dama:1}
kinds:
  pod: {command: [x], runner: kubernetes, pod: {spec: {containers: [{name: task, image: python}]}}}
  kept: {command: [x], runner: kubernetes, pod: {spec: {}}, pod_retention: 0s, lock_mode: advisory}
  local: {command: [x]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pod, kept, local := cfg.Kinds["pod"], cfg.Kinds["kept"], cfg.Kinds["local"]
	if pod.LockMode != config.LockModeRow || pod.User != "" || pod.StartTimeout != config.DefaultStartTimeout || *pod.PodRetention != config.Duration(48*time.Hour) {
		t.Errorf("kubernetes kind: lock mode %s, user %q, start_timeout %s, pod_retention %s", pod.LockMode, pod.User, pod.StartTimeout, *pod.PodRetention)
	}
	if string(pod.Pod) != `{"spec":{"containers":[{"image":"python","name":"task"}]}}` {
		t.Errorf("pod template %s", pod.Pod)
	}
	if kept.LockMode != config.LockModeAdvisory || *kept.PodRetention != 0 {
		t.Errorf("kept: lock mode %s, pod_retention %s", kept.LockMode, *kept.PodRetention)
	}
	if local.Runner != config.RunnerHost || local.LockMode != config.LockModeHost || local.User != "etl" || local.PodRetention != nil {
		t.Errorf("host kind: runner %s, lock mode %s, user %q", local.Runner, local.LockMode, local.User)
	}
	if !cfg.Runs(config.RunnerKubernetes) || !cfg.Runs(config.RunnerHost) {
		t.Error("Runs does not see both runners")
	}
}

func TestLockModeDefaultsAndValidation(t *testing.T) {
	cfg, err := config.Parse([]byte("log_dir: /l\nkinds: {a: {command: [x]}, b: {command: [y], lock_mode: advisory}}"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := cfg.Kind("a")
	b, _ := cfg.Kind("b")
	if cfg.LockMode != config.LockModeRow || a.LockMode != config.LockModeRow || b.LockMode != config.LockModeAdvisory {
		t.Errorf("lock modes: config %q, a %q, b %q", cfg.LockMode, a.LockMode, b.LockMode)
	}
	// A hand-built configuration, given its defaults, is what Parse gives.
	hand := (&config.Config{LogDir: "/l", Kinds: map[string]config.Kind{
		"a": {Command: []string{"x"}},
		"b": {Command: []string{"y"}, LockMode: config.LockModeAdvisory},
	}}).WithDefaults()
	if err := hand.Validate(); err != nil {
		t.Fatalf("hand-built config: %v", err)
	}
	if !reflect.DeepEqual(hand, cfg) {
		t.Errorf("hand-built config, with defaults:\n%+v\nparsed:\n%+v", hand, cfg)
	}
	if err := (&config.Config{LogDir: "/l", Kinds: map[string]config.Kind{"a": {Command: []string{"x"}}}}).Validate(); err == nil {
		t.Error("Validate accepts a configuration without its defaults")
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
	for _, args := range []string{`{"source": {"region": "eu-west"}}`, `{"source": {"region": 12345678901234567890}}`, `{"source": {"region": {"b": 1, "a": 2}}}`} {
		if err := a.CheckConcurrencyKey([]byte(args)); err != nil {
			t.Errorf("CheckConcurrencyKey(%s) = %v, want nil", args, err)
		}
	}
	long := `{"source": {"region": "` + strings.Repeat("x", config.MaxConcurrencyKey+1) + `"}}`
	for _, args := range []string{`{}`, `{"source": "eu"}`, `{"source": {"region": null}}`, ``, long} {
		if err := a.CheckConcurrencyKey([]byte(args)); err == nil || !strings.Contains(err.Error(), "source.region") {
			t.Errorf("CheckConcurrencyKey(%s) = %v, want an error naming the field", args, err)
		}
	}
	b, _ := cfg.Kind("b")
	if err := b.CheckConcurrencyKey([]byte(`{"region": "eu"}`)); err != nil {
		t.Errorf("a kind without concurrency_key: %v", err)
	}
}

// TestDurationsWrittenAsABareZero: "kill_grace: 0" is zero, as dama always
// read it, though YAML reads a bare 0 as an integer; a zero elsewhere (in
// a task's arguments) stays a number, and a bare non-zero number is still
// refused, lacking its unit.
func TestDurationsWrittenAsABareZero(t *testing.T) {
	cfg, err := config.Parse([]byte(`
log_dir: /l
reconnect_grace: 0
kinds:
  a: {command: [x], kill_grace: 0, timeout: +0, retry: {delay: 1m, max_delay: 0}}
  b:
    command: [x]
    schedule: "@daily"
    schedule_args: {timeout: 0, kill_grace: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Kinds["a"], cfg.Kinds["b"]
	if *cfg.ReconnectGrace != 0 || *a.KillGrace != 0 || a.Timeout != 0 || a.Retry.MaxDelay != config.DefaultRetryMaxDelay {
		t.Errorf("reconnect_grace %v, kill_grace %v, timeout %v, max_delay %v: want 0, 0, 0 and the default", *cfg.ReconnectGrace, *a.KillGrace, a.Timeout, a.Retry.MaxDelay)
	}
	if string(b.ScheduleArgs) != `{"kill_grace":0,"timeout":0}` {
		t.Errorf("schedule_args %s: want the numbers kept", b.ScheduleArgs)
	}
	_, err = config.Parse([]byte("log_dir: /l\nkinds:\n  a: {command: [x], kill_grace: 5}\n"))
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("kill_grace: 5 gave %v, want an error on line 3", err)
	}
}

// TestTheDefaultQueueNeedNotBeConfigured: a kind naming the queue
// "default" runs there although queues does not list it.
func TestTheDefaultQueueNeedNotBeConfigured(t *testing.T) {
	cfg, err := config.Parse([]byte("log_dir: /l\nqueues: {etl: {max_running: 2}}\nkinds: {a: {command: [x], queue: default}}"))
	if err != nil {
		t.Fatal(err)
	}
	if q, ok := cfg.Queues[config.DefaultQueue]; !ok || q.MaxRunning != config.DefaultMaxRunning {
		t.Errorf("queues %v: want default with max_running %d", cfg.Queues, config.DefaultMaxRunning)
	}
}

// What a supervisor publishes of a kind in data_manager.kinds, which every
// dama role reads, is these settings and no other: a field added to Kind
// is published only once it is named here, and a kubernetes kind's pod
// template, whose env may hold values, never is.
func TestResourcesAndTheirDefault(t *testing.T) {
	cfg, err := config.Parse([]byte(`
log_dir: /l
cgroup_parent: /dama
resources: {memory: 512MiB}
kubernetes: {image: d}
kinds:
  plain: {command: [x]}
  big: {command: [x], resources: {memory: 1.5GiB, cpu: 1.5, pids: 1000}}
  pod: {command: [x], runner: kubernetes, pod: {spec: {}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*config.Resources{
		"plain": {Memory: 512 << 20},
		"big":   {Memory: 3 << 29, CPU: 1.5, Pids: 1000},
		"pod":   nil,
	}
	for name, w := range want {
		if got := cfg.Kinds[name].Resources; !reflect.DeepEqual(got, w) {
			t.Errorf("kind %s: resources %+v, want %+v", name, got, w)
		}
	}
	for s, want := range map[string]string{"1.5GiB": "1.5GiB", "2147483648": "2GiB", "100": "100B", "1025KiB": "1MiB"} {
		b, err := config.ParseByteSize(s)
		if err != nil || b.String() != want {
			t.Errorf("ParseByteSize(%q) = %s, %v; want %s", s, b, err, want)
		}
	}
}

func TestAKindPublishesItsSettingsAndNothingElse(t *testing.T) {
	published := []string{
		"queue", "command", "function", "max_attempts", "retry", "retry_on_exit_codes", "fail_on_exit_codes",
		"timeout", "on_timeout", "stall_after", "on_stall", "kill_grace", "lock_mode", "max_running", "concurrency_key",
		"max_running_per_key", "schedule", "timezone", "overlap", "schedule_args", "await_children",
		"children", "pass_env", "session_fence", "user", "group", "resources",
	}
	var tagged []string
	for f := range reflect.TypeFor[config.Kind]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			t.Errorf("Kind.%s has no json name: publish it under one, or withhold it with json:\"-\"", f.Name)
		}
		if name != "-" {
			tagged = append(tagged, name)
		}
	}
	slices.Sort(tagged)
	slices.Sort(published)
	if !slices.Equal(tagged, published) {
		t.Errorf("Kind publishes %q, want %q", tagged, published)
	}

	cfg, err := config.Parse([]byte(`
log_dir: /tmp/logs
kubernetes: {image: dama}
kinds:
  load:
    runner: kubernetes
    command: [/opt/etl/load]
    pod: {containers: [{name: task, image: etl, env: [{name: PGPASSWORD, value: hunter2}]}]}
    pod_retention: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := cfg.Kind("load")
	b, err := k.Settings()
	if err != nil || strings.Contains(string(b), "hunter2") || strings.Contains(string(b), "pod") {
		t.Errorf("the settings of a kubernetes kind are %s, %v", b, err)
	}
}
