package config_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/dama-etl/dama/config"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		// The example of docs/configuration.md.
		`log_dir: /var/lib/dama/logs
poll_interval: 5s
heartbeat_interval: 5s
lock_mode: row
kill_grace: 10s
reconnect_grace: 2m
log_tail_bytes: 1048576
log_tail_interval: 5s
queues:
  etl: { max_running: 4 }
kinds:
  conflation:
    queue: etl
    command: ["/opt/etl/conflation", "--verbose"]
    max_attempts: 3
    lock_mode: advisory
    max_running: 1
  regional_load:
    queue: etl
    command: ["/opt/etl/load"]
    concurrency_key: source.region
    max_running_per_key: 1
  nightly_export:
    command: ["/opt/etl/export"]
    schedule: "30 2 * * *"
    timezone: Europe/Paris
    overlap: skip
    schedule_args: { full: true }
  import_all:
    command: ["/opt/etl/split"]
    await_children: true
  copy_rows:
    function: copy_rows
`,
		"log_dir: /l\nkinds: {a: {command: [x]}}",
		"log_dir: /l\ncgroup_parent: /dama\nresources: {memory: 512MiB}\nkinds: {a: {command: [x], resources: {memory: 1.5GiB, cpu: 1.5, pids: 1000}}}",
		"log_dir: l\nreconnect_grace: 0s\nkill_grace: 0s\nkinds: {a: {function: f, lock_mode: advisory}}",
		"log_dir: /l\nkinds: {a: {command: [x], retry: {backoff: fixed, delay: 30s}, fail_on_exit_codes: [2, 255]}}",
		"log_dir: /l\nkinds: {a: {command: [x], max_attempts: 40, retry: {delay: 1m, max_delay: 8760h}}}",
		// A cap of nearly 300 years, where doubling the wait overflows.
		"log_dir: /l\nkinds: {a: {command: [x], max_attempts: 40, retry: {max_delay: 2562047h}}}",
		"log_dir: /l\nkinds: {a: {command: [x], retry: {max_attempts: 5}, retry_on_exit_codes: [75], timeout: 1h, on_timeout: fail, stall_after: 30m, on_stall: kill, kill_grace: 1s}}",
		"log_dir: /l\nkinds: {a: {command: [x], max_attempts: 32767}, b: {command: [x], retry: {max_attempts: 32768}}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: '*/5 * * * * *', overlap: queue, schedule_args: {region: eu, n: 12345678901234567890, f: 1.5e300, l: [1, null, true]}, concurrency_key: region}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: '@daily', timezone: America/New_York, overlap: allow, max_running: 3}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: '0 0 29 2 */2'}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: '0 0 30 2 *'}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: '@every 1h'}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule: 'TZ=UTC 0 * * * *'}}",
		"log_dir: /l\nkinds: {a: {command: [x], schedule_args: {a: .nan}, schedule: '@hourly'}}",
		"log_dir: /l\nkinds: {a: {command: [x], timezone: Local, schedule: '@hourly'}}",
		"log_dir: /l\nqueues: {q: {max_running: 0}, r: ~}\nkinds: {a: {command: [x], queue: q}, b: {command: [y], queue: r}}",
		"log_dir: /l\ndefaults: &d {command: [x], max_attempts: 2}\nkinds: {a: *d}",
		"log_dir: /l\nkinds:\n  a: &k {command: [x]}\n  b: {<<: *k, max_attempts: 9}",
		"log_dir: !!binary AAEC\nkinds: {a: {command: [x]}}",
		"log_dir: /l\nkinds: {a: {command: [x]}}\n---\nlog_dir: /m",
		"log_dir: /l\npoll_interval: 99ms\nkinds: {a: {command: [x]}}",
		"log_dir: /l\nkinds: {'a b': {command: [x]}}",
		"log_dir: /l\nkinds: {a: {command: ['']}}",
		"log_dir: /l\nkinds: {a: ~}",
		"log_dir: /l\nuser: etl\nlog_group: adm\nlog_tail_bytes: -1\nretention: -1s\nprogress_interval: 1ms\nkinds: {a: {command: [x], user: e, group: g, session_fence: false, pass_env: [PGAPPNAME]}, b: {function: f}}",
		"log_dir: /l\ngroup: g\nkinds: {a: {command: [x]}}",
		"log_dir: /l\nkinds: {a: {command: [x], user: 'a b'}}",
		"kinds: 5",
		"log_dir: [",
		"",
		"log_dir: /l\nqueues: {etl: {max_runing: 4}}\nkinds: {a: {command: [x], queue: etl}}",
		"log_dir: /l\nkinds: {a: {command: /bin/true, max_attempts: many, retry_on_exit_codes: [a], await_children: maybe}}",
		"log_dir: /l\nqueues: [a]\nkinds: {a: {command: [x], schedule_args: 5, retry: [1]}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		again, errAgain := config.Parse(data)
		if (err == nil) != (errAgain == nil) {
			t.Fatalf("parsed twice: %v, then %v", err, errAgain)
		}
		if err != nil {
			if cfg != nil || err.Error() == "" {
				t.Fatalf("Parse = %+v, %q: want nil and a message", cfg, err)
			}
			// In the configuration's words: no Go type, no YAML tag but
			// the configuration's own.
			for _, goWords := range []string{"config.", "!!", "unmarshal", "map[", "[]string", "[]int", "time.Duration", "\n"} {
				if strings.Contains(err.Error(), goWords) && !bytes.Contains(data, []byte(goWords)) {
					t.Fatalf("Parse's error names %q: %q", goWords, err)
				}
			}
			return
		}
		checkConfig(t, cfg)
		if !reflect.DeepEqual(normalized(cfg), normalized(again)) {
			t.Fatalf("parsed twice:\n%+v\n%+v", cfg, again)
		}
		// The defaults are a fixed point: the configuration as parsed,
		// written out with every setting explicit, reads back the same.
		out := render(t, cfg)
		back, err := config.Parse(out)
		if err != nil {
			t.Fatalf("the parsed configuration, written out, is refused: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(normalized(cfg), normalized(back)) {
			t.Fatalf("the parsed configuration, written out, reads back otherwise:\n%s\nwas  %+v\nread %+v", out, cfg, back)
		}
	})
}

// checkConfig fails unless cfg holds what Parse promises of a configuration
// it accepts.
func checkConfig(t *testing.T, cfg *config.Config) {
	t.Helper()
	validMode := func(m config.LockMode) bool { return m == config.LockModeRow || m == config.LockModeAdvisory }
	switch {
	case cfg.LogDir == "":
		t.Fatal("accepted without log_dir")
	case time.Duration(cfg.PollInterval) < 100*time.Millisecond || time.Duration(cfg.HeartbeatInterval) < 100*time.Millisecond:
		t.Fatalf("intervals %v, %v: want at least 100ms", cfg.PollInterval, cfg.HeartbeatInterval)
	case cfg.KillGrace < 0 || cfg.ReconnectGrace == nil || *cfg.ReconnectGrace < 0:
		t.Fatalf("graces %v, %v: want set and not negative", cfg.KillGrace, cfg.ReconnectGrace)
	case !validMode(cfg.LockMode):
		t.Fatalf("lock_mode %q", cfg.LockMode)
	case len(cfg.Kinds) == 0:
		t.Fatal("accepted without kinds")
	}
	for name, q := range cfg.Queues {
		if !config.ValidName(name) || q.MaxRunning < 1 {
			t.Fatalf("queue %q: %+v", name, q)
		}
	}
	for name, k := range cfg.Kinds {
		if !config.ValidName(name) {
			t.Fatalf("kind name %q", name)
		}
		if got, ok := cfg.Kind(name); !ok || !reflect.DeepEqual(got, k) {
			t.Fatalf("Kind(%q) = %+v, %v", name, got, ok)
		}
		switch {
		case (k.Function != "") == (len(k.Command) > 0):
			t.Fatalf("kind %s: command %q and function %q: want exactly one", name, k.Command, k.Function)
		case len(k.Command) > 0 && k.Command[0] == "":
			t.Fatalf("kind %s: empty program", name)
		case k.Function != "" && (!config.ValidName(k.Function) || len(k.RetryOnExitCodes)+len(k.FailOnExitCodes) > 0):
			t.Fatalf("kind %s: function %q with exit codes %v %v", name, k.Function, k.RetryOnExitCodes, k.FailOnExitCodes)
		case k.Queue == "":
			t.Fatalf("kind %s: no queue", name)
		// River's jobs hold max_attempts in a smallint.
		case k.MaxAttempts < 1 || k.MaxAttempts > math.MaxInt16 || k.MaxRunning < 0 || k.Timeout < 0:
			t.Fatalf("kind %s: max_attempts %d, max_running %d, timeout %v", name, k.MaxAttempts, k.MaxRunning, k.Timeout)
		case (k.ConcurrencyKey == "") != (k.MaxRunningPerKey == 0) || k.MaxRunningPerKey < 0:
			t.Fatalf("kind %s: concurrency_key %q, max_running_per_key %d", name, k.ConcurrencyKey, k.MaxRunningPerKey)
		case !validMode(k.LockMode):
			t.Fatalf("kind %s: lock_mode %q", name, k.LockMode)
		case k.OnTimeout != config.OnTimeoutRetry && k.OnTimeout != config.OnTimeoutFail:
			t.Fatalf("kind %s: on_timeout %q", name, k.OnTimeout)
		case k.StallAfter != 0 && k.StallAfter < config.Duration(time.Second), k.OnStall == config.OnStallKill && k.StallAfter == 0:
			t.Fatalf("kind %s: stall_after %v, on_stall %q", name, k.StallAfter, k.OnStall)
		case k.KillGrace == nil || *k.KillGrace < 0:
			t.Fatalf("kind %s: kill grace %v", name, *k.KillGrace)
		case len(k.RetryOnExitCodes) > 0 && len(k.FailOnExitCodes) > 0:
			t.Fatalf("kind %s: both exit code lists", name)
		}
		if _, ok := cfg.Queues[k.Queue]; !ok {
			t.Fatalf("kind %s: queue %q is not among the queues %v", name, k.Queue, cfg.QueueNames())
		}
		for code := 0; code <= 256; code++ {
			listed := slices.Contains(k.RetryOnExitCodes, code) || slices.Contains(k.FailOnExitCodes, code)
			if listed && (code < 1 || code > 255) {
				t.Fatalf("kind %s: exit code %d listed", name, code)
			}
			want := !slices.Contains(k.FailOnExitCodes, code)
			if len(k.RetryOnExitCodes) > 0 {
				want = slices.Contains(k.RetryOnExitCodes, code)
			}
			if k.RetriesExit(code) != want {
				t.Fatalf("kind %s: RetriesExit(%d) = %v", name, code, !want)
			}
		}
		checkRetry(t, name, k)
		checkSchedule(t, name, k)
	}
	if !slices.IsSorted(cfg.KindNames()) || !slices.IsSorted(cfg.QueueNames()) || !slices.IsSorted(cfg.Functions()) {
		t.Fatalf("names out of order: %v %v %v", cfg.KindNames(), cfg.QueueNames(), cfg.Functions())
	}
}

// checkRetry checks kind k's retry policy and the waits it gives, beyond
// max_attempts too: `dama retry` grants more attempts.
func checkRetry(t *testing.T, name string, k config.Kind) {
	t.Helper()
	p := k.Retry
	if p == nil {
		for attempt := 1; attempt <= 70; attempt++ {
			if d := k.RetryDelay(attempt); d != 0 {
				t.Fatalf("kind %s without retry: RetryDelay(%d) = %v, want River's (0)", name, attempt, d)
			}
		}
		return
	}
	switch {
	case p.Backoff != config.BackoffExponential && p.Backoff != config.BackoffFixed:
		t.Fatalf("kind %s: retry.backoff %q", name, p.Backoff)
	case p.Delay <= 0 || p.MaxDelay < p.Delay:
		t.Fatalf("kind %s: retry.delay %v, retry.max_delay %v", name, p.Delay, p.MaxDelay)
	case p.MaxAttempts != 0 && p.MaxAttempts != k.MaxAttempts:
		t.Fatalf("kind %s: retry.max_attempts %d, max_attempts %d", name, p.MaxAttempts, k.MaxAttempts)
	}
	prev := time.Duration(0)
	for attempt := 1; attempt <= 70; attempt++ {
		d := k.RetryDelay(attempt)
		switch {
		case d < time.Duration(p.Delay) || d > time.Duration(p.MaxDelay):
			t.Fatalf("kind %s: RetryDelay(%d) = %v: want from %v to %v", name, attempt, d, p.Delay, p.MaxDelay)
		case d < prev:
			t.Fatalf("kind %s: RetryDelay(%d) = %v, shorter than the wait before, %v", name, attempt, d, prev)
		case p.Backoff == config.BackoffFixed && d != time.Duration(p.Delay):
			t.Fatalf("kind %s: fixed backoff: RetryDelay(%d) = %v, want %v", name, attempt, d, p.Delay)
		}
		prev = d
	}
}

// checkSchedule checks kind k's schedule settings.
func checkSchedule(t *testing.T, name string, k config.Kind) {
	t.Helper()
	sched, err := k.ScheduleOf()
	if k.Schedule == "" {
		if sched != nil || err != nil || k.Timezone != "" || k.Overlap != "" || k.ScheduleArgs != nil {
			t.Fatalf("kind %s without schedule: %+v, %v, timezone %q, overlap %q, args %s", name, sched, err, k.Timezone, k.Overlap, k.ScheduleArgs)
		}
		return
	}
	if err != nil {
		t.Fatalf("kind %s: schedule accepted, then refused: %v", name, err)
	}
	if now := time.Now(); !sched.Next(now).After(now) {
		t.Fatalf("kind %s: schedule %q has no next tick", name, k.Schedule)
	}
	switch k.Overlap {
	case config.OverlapSkip, config.OverlapAllow:
	case config.OverlapQueue:
		if k.MaxRunning != 1 {
			t.Fatalf("kind %s: overlap queue with max_running %d", name, k.MaxRunning)
		}
	default:
		t.Fatalf("kind %s: overlap %q", name, k.Overlap)
	}
	args := bytes.TrimSpace(k.ScheduleArgs)
	if !json.Valid(args) || len(args) == 0 || args[0] != '{' || len(args) > 96<<10 {
		t.Fatalf("kind %s: schedule_args %q: want a JSON object of at most 96 KiB", name, args)
	}
	if err := k.CheckConcurrencyKey(json.RawMessage(k.ScheduleArgs)); err != nil {
		t.Fatalf("kind %s: schedule_args accepted without the concurrency key: %v", name, err)
	}
}

// normalized is cfg with empty lists as nil: YAML's "[]" and a missing
// list mean the same.
func normalized(cfg *config.Config) config.Config {
	c := *cfg
	c.Kinds = make(map[string]config.Kind, len(cfg.Kinds))
	for name, k := range cfg.Kinds {
		if len(k.Command) == 0 {
			k.Command = nil
		}
		if len(k.RetryOnExitCodes) == 0 {
			k.RetryOnExitCodes = nil
		}
		if len(k.FailOnExitCodes) == 0 {
			k.FailOnExitCodes = nil
		}
		if len(k.PassEnv) == 0 {
			k.PassEnv = nil
		}
		c.Kinds[name] = k
	}
	return c
}

// The configuration file's shape with every setting written out, for
// render.
type (
	fullConfig struct {
		LogDir            quoted               `yaml:"log_dir"`
		PollInterval      string               `yaml:"poll_interval"`
		HeartbeatInterval string               `yaml:"heartbeat_interval"`
		KillGrace         string               `yaml:"kill_grace"`
		ReconnectGrace    string               `yaml:"reconnect_grace"`
		LockMode          string               `yaml:"lock_mode"`
		LogGroup          quoted               `yaml:"log_group,omitempty"`
		User              quoted               `yaml:"user,omitempty"`
		Group             quoted               `yaml:"group,omitempty"`
		ProgressInterval  string               `yaml:"progress_interval"`
		LogTailBytes      int64                `yaml:"log_tail_bytes"`
		LogTailInterval   string               `yaml:"log_tail_interval"`
		Retention         string               `yaml:"retention"`
		CgroupParent      quoted               `yaml:"cgroup_parent,omitempty"`
		Resources         *config.Resources    `yaml:"resources,omitempty"`
		Queues            map[string]fullQueue `yaml:"queues"`
		Kinds             map[string]fullKind  `yaml:"kinds"`
	}
	fullQueue struct {
		MaxRunning int `yaml:"max_running"`
	}
	fullKind struct {
		Queue            string            `yaml:"queue"`
		Command          []quoted          `yaml:"command,omitempty"`
		Function         quoted            `yaml:"function,omitempty"`
		MaxAttempts      int               `yaml:"max_attempts"`
		Retry            *fullRetry        `yaml:"retry,omitempty"`
		RetryOnExitCodes []int             `yaml:"retry_on_exit_codes,omitempty"`
		FailOnExitCodes  []int             `yaml:"fail_on_exit_codes,omitempty"`
		Timeout          string            `yaml:"timeout"`
		OnTimeout        string            `yaml:"on_timeout"`
		StallAfter       string            `yaml:"stall_after"`
		OnStall          string            `yaml:"on_stall"`
		KillGrace        *string           `yaml:"kill_grace,omitempty"`
		LockMode         string            `yaml:"lock_mode"`
		MaxRunning       int               `yaml:"max_running"`
		ConcurrencyKey   quoted            `yaml:"concurrency_key,omitempty"`
		MaxRunningPerKey int               `yaml:"max_running_per_key"`
		Schedule         quoted            `yaml:"schedule,omitempty"`
		Timezone         string            `yaml:"timezone,omitempty"`
		Overlap          string            `yaml:"overlap,omitempty"`
		ScheduleArgs     *yaml.Node        `yaml:"schedule_args,omitempty"`
		AwaitChildren    bool              `yaml:"await_children"`
		PassEnv          []string          `yaml:"pass_env,omitempty"`
		SessionFence     bool              `yaml:"session_fence"`
		User             quoted            `yaml:"user,omitempty"`
		Group            quoted            `yaml:"group,omitempty"`
		Resources        *config.Resources `yaml:"resources,omitempty"`
	}
	fullRetry struct {
		MaxAttempts int    `yaml:"max_attempts"`
		Backoff     string `yaml:"backoff"`
		Delay       string `yaml:"delay"`
		MaxDelay    string `yaml:"max_delay"`
	}
)

// quoted is a string written double-quoted: the YAML encoder writes some
// strings of several lines (a blank first line, then an indented one) as
// a block scalar its own decoder misreads, a bug of the library's and not
// of what dama reads.
type quoted string

func (q quoted) MarshalYAML() (any, error) {
	if !utf8.ValidString(string(q)) {
		// A path is bytes, which YAML writes only as binary (as a file
		// may give it, log_dir: !!binary ...).
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!binary", Value: base64.StdEncoding.EncodeToString([]byte(q))}, nil
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Style: yaml.DoubleQuotedStyle, Value: string(q)}, nil
}

func (q quoted) IsZero() bool { return q == "" }

func quoteAll(s []string) []quoted {
	out := make([]quoted, len(s))
	for i, v := range s {
		out[i] = quoted(v)
	}
	return out
}

// render writes cfg as a configuration file with every setting explicit.
func render(t *testing.T, cfg *config.Config) []byte {
	t.Helper()
	dur := func(d time.Duration) string { return d.String() }
	out := fullConfig{
		LogDir:            quoted(cfg.LogDir),
		PollInterval:      dur(time.Duration(cfg.PollInterval)),
		HeartbeatInterval: dur(time.Duration(cfg.HeartbeatInterval)),
		KillGrace:         dur(time.Duration(cfg.KillGrace)),
		ReconnectGrace:    dur(time.Duration(*cfg.ReconnectGrace)),
		LockMode:          string(cfg.LockMode),
		LogGroup:          quoted(cfg.LogGroup),
		User:              quoted(cfg.User),
		Group:             quoted(cfg.Group),
		ProgressInterval:  dur(time.Duration(cfg.ProgressInterval)),
		LogTailBytes:      int64(cfg.LogTailBytes),
		LogTailInterval:   dur(time.Duration(cfg.LogTailInterval)),
		Retention:         dur(time.Duration(cfg.Retention)),
		CgroupParent:      quoted(cfg.CgroupParent),
		Resources:         cfg.Resources,
		Queues:            map[string]fullQueue{},
		Kinds:             map[string]fullKind{},
	}
	for name, q := range cfg.Queues {
		out.Queues[name] = fullQueue{MaxRunning: q.MaxRunning}
	}
	for name, k := range cfg.Kinds {
		fk := fullKind{
			Queue: k.Queue, Command: quoteAll(k.Command), Function: quoted(k.Function), MaxAttempts: k.MaxAttempts,
			RetryOnExitCodes: k.RetryOnExitCodes, FailOnExitCodes: k.FailOnExitCodes,
			Timeout: dur(time.Duration(k.Timeout)), OnTimeout: string(k.OnTimeout), LockMode: string(k.LockMode),
			StallAfter: dur(time.Duration(k.StallAfter)), OnStall: string(k.OnStall),
			MaxRunning: k.MaxRunning, ConcurrencyKey: quoted(k.ConcurrencyKey), MaxRunningPerKey: k.MaxRunningPerKey,
			Schedule: quoted(k.Schedule), Timezone: k.Timezone, Overlap: string(k.Overlap), AwaitChildren: k.AwaitChildren,
			PassEnv: k.PassEnv, SessionFence: k.FencesSessions(), User: quoted(k.User), Group: quoted(k.Group),
			Resources: k.Resources,
		}
		if p := k.Retry; p != nil {
			fk.Retry = &fullRetry{MaxAttempts: p.MaxAttempts, Backoff: string(p.Backoff), Delay: dur(time.Duration(p.Delay)), MaxDelay: dur(time.Duration(p.MaxDelay))}
		}
		if k.KillGrace != nil {
			s := dur(time.Duration(*k.KillGrace))
			fk.KillGrace = &s
		}
		if k.ScheduleArgs != nil {
			dec := json.NewDecoder(bytes.NewReader(k.ScheduleArgs))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("kind %s: schedule_args %q: %v", name, k.ScheduleArgs, err)
			}
			fk.ScheduleArgs = yamlNode(v)
		}
		out.Kinds[name] = fk
	}
	b, err := yaml.Marshal(out)
	if err != nil {
		t.Fatalf("write the configuration: %v", err)
	}
	return b
}

// yamlNode is the YAML of a decoded JSON value, its numbers as written:
// through a float64 a large integer would change.
func yamlNode(v any) *yaml.Node {
	switch v := v.(type) {
	case map[string]any:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, yamlNode(v[k]))
		}
		return n
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range v {
			n.Content = append(n.Content, yamlNode(e))
		}
		return n
	case string:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
	case json.Number:
		// A float64 too large for an integer is written without an
		// exponent too, "20000000000000010000".
		tag := "!!float"
		if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			tag = "!!int"
		} else if _, err := strconv.ParseUint(string(v), 10, 64); err == nil {
			tag = "!!int"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: string(v)}
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v)}
	default:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	}
}
