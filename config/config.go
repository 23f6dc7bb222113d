// Package config reads dama's YAML configuration: where task logs go, how
// often the supervisor polls, the queues with their limits, and the kinds of
// task a supervisor may run with their commands.
//
// Only the kinds named here ever run: a task's kind is looked up in the
// configuration of the supervisor that launches it, and its command comes from
// there, never from the database.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults applied to fields the file leaves out.
const (
	DefaultPollInterval      = 5 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultKillGrace         = 10 * time.Second
	DefaultReconnectGrace    = 2 * time.Minute
	DefaultMaxAttempts       = 3
	DefaultMaxRunning        = 10
	DefaultMaxRunningPerKey  = 1
	DefaultQueue             = "default"
	DefaultLockMode          = LockModeRow
)

// attemptsLimit bounds max_attempts: River keeps a job's max_attempts in a
// smallint, and would silently cut a larger one down to this.
const attemptsLimit = math.MaxInt16

// LockMode says how a task process holds the lock that proves it runs.
type LockMode string

const (
	// LockModeRow, the default, is the seed design: the context's INITIAL
	// event row is locked FOR UPDATE in a transaction held open for the
	// task's whole life, on a connection of its own; writes go over a
	// second connection. Two server connections per task, and the open
	// transaction keeps VACUUM from removing any row version that died
	// after the task started, in every table of the cluster.
	LockModeRow LockMode = "row"
	// LockModeAdvisory holds a session-level advisory lock keyed by the
	// context id, with no transaction left open: the lock, the writes and
	// the cancellation LISTEN share one connection, and VACUUM is left
	// alone. The guarantees are the same as row mode's.
	LockModeAdvisory LockMode = "advisory"
)

func (m LockMode) validate() error {
	if m != LockModeRow && m != LockModeAdvisory {
		return fmt.Errorf("lock_mode %q: want %q or %q", m, LockModeRow, LockModeAdvisory)
	}
	return nil
}

// ConnectionsPerTask is how many server connections a running task process
// of this mode holds.
func (m LockMode) ConnectionsPerTask() int {
	if m == LockModeAdvisory {
		return 1
	}
	return 2
}

// Config is a parsed and validated configuration file.
type Config struct {
	// Path is the absolute path of the file the configuration was read from.
	Path string `yaml:"-"`
	// LogDir holds one log file per task, <etl_context_id>.log.
	LogDir string `yaml:"log_dir"`
	// PollInterval is how often the supervisor looks, in one statement, at
	// the locks of every running task (to find those whose task process
	// died), rescues the steps of dead supervisors and reconciles contexts
	// with their jobs. Default 5s.
	PollInterval Duration `yaml:"poll_interval"`
	// HeartbeatInterval is how long a task process's lock connection may be
	// silent before the kernel probes it (TCP keepalive); a loss is noticed
	// within it plus three probes. Nothing is written: the lock is the proof
	// of life. Default 5s.
	HeartbeatInterval Duration `yaml:"heartbeat_interval"`
	// KillGrace is how long a task's command has between SIGTERM and SIGKILL
	// when it is cancelled or loses its lock.
	KillGrace Duration `yaml:"kill_grace"`
	// ReconnectGrace is how long a task process keeps its command running
	// after losing its lock connection (a database restart, a failover, a
	// network cut) while it tries to take its lock again under the same run.
	// Past it, the command is stopped and the task retried. Default 2m; "0s"
	// stops the command as soon as the lock connection fails.
	ReconnectGrace *Duration `yaml:"reconnect_grace"`
	// LockMode is how task processes hold their lock, "row" (the default) or
	// "advisory"; a kind may override it. See LockModeRow and
	// LockModeAdvisory: advisory suits tasks that run for days.
	LockMode LockMode `yaml:"lock_mode"`
	// Queues maps a queue name to its limits.
	Queues map[string]Queue `yaml:"queues"`
	// Kinds maps a task kind to how it runs.
	Kinds map[string]Kind `yaml:"kinds"`
}

// Queue holds the limits of one queue.
type Queue struct {
	// MaxRunning bounds the tasks of this queue running at once, across every
	// supervisor sharing the database.
	MaxRunning int `yaml:"max_running"`
}

// Kind says how the tasks of one kind run.
type Kind struct {
	// Queue is the queue the kind's tasks wait in.
	Queue string `yaml:"queue"`
	// Command is the program and its arguments; it is executed directly,
	// never through a shell. A kind has a command or a function, not both.
	Command []string `yaml:"command"`
	// Function names a Go function that the program embedding the
	// supervisor registers (supervisor.Options.Funcs): the task process is
	// that program, executed again, calling it. Several kinds may name
	// one function. Only such a program's supervisor runs the kind; the
	// dama binary refuses a configuration with function kinds in its
	// supervisor, and accepts it everywhere else (submit, status).
	Function string `yaml:"function"`
	// MaxAttempts is how many times a task is started before it is FAILED;
	// default 3. Retry.MaxAttempts is the same setting.
	MaxAttempts int `yaml:"max_attempts"`
	// Retry is when a failed attempt is tried again; nil means River's
	// default backoff (attempt⁴ seconds, with jitter).
	Retry *RetryPolicy `yaml:"retry"`
	// RetryOnExitCodes, when set, lists the command's exit codes after
	// which the task is retried: any other failure fails it for good.
	// FailOnExitCodes lists the exit codes after which it fails for good
	// (the command says "do not retry this"). At most one of the two is
	// set; by default every failure is retried.
	RetryOnExitCodes []int `yaml:"retry_on_exit_codes"`
	FailOnExitCodes  []int `yaml:"fail_on_exit_codes"`
	// Timeout bounds the wall time of one attempt's command; 0, the
	// default, means none: tasks that run for days are normal. A command
	// that runs longer is stopped (its process group gets SIGTERM, then
	// SIGKILL after KillGrace), a TIMEOUT event is recorded, and the
	// attempt fails; OnTimeout says whether the task is then retried
	// ("retry", the default) or FAILED ("fail").
	Timeout   Duration  `yaml:"timeout"`
	OnTimeout OnTimeout `yaml:"on_timeout"`
	// KillGrace overrides the configuration's kill_grace for this kind;
	// nil means the configuration's.
	KillGrace *Duration `yaml:"kill_grace"`
	// LockMode overrides the configuration's lock_mode for this kind; empty
	// means the configuration's.
	LockMode LockMode `yaml:"lock_mode"`
	// MaxRunning bounds the tasks of this kind running at once, across
	// every supervisor sharing the database and every queue; 1 means the
	// kind's tasks never run concurrently. 0, the default, means no bound
	// but the queue's.
	MaxRunning int `yaml:"max_running"`
	// ConcurrencyKey names a field of the task's arguments ("region", or
	// "source.region" inside an object); tasks of the kind with the same
	// value run at most MaxRunningPerKey at a time, across every
	// supervisor. A submission whose arguments lack the field is refused.
	// Empty, the default, means no key.
	ConcurrencyKey string `yaml:"concurrency_key"`
	// MaxRunningPerKey bounds the running tasks of each concurrency key;
	// default 1 when ConcurrencyKey is set.
	MaxRunningPerKey int `yaml:"max_running_per_key"`
	// Schedule makes the kind periodic: a cron expression ("*/15 * * * *",
	// five fields from the minute, or six from the second, or a descriptor
	// such as "@daily"; not "@every"). At each tick one task is submitted,
	// by one of the supervisors that configure the kind, whichever runs;
	// ticks missed while none ran give one task, at the first start after.
	// Empty, the default, means none.
	Schedule string `yaml:"schedule"`
	// Timezone is the IANA time zone the schedule is read in ("Europe/Paris");
	// default UTC.
	Timezone string `yaml:"timezone"`
	// Overlap is what a tick does while an earlier task of the kind is
	// unfinished: "skip" (the default), "queue" or "allow"; see Overlap.
	Overlap Overlap `yaml:"overlap"`
	// ScheduleArgs are the arguments of the tasks a tick submits, a
	// mapping; default {}.
	ScheduleArgs JSONObject `yaml:"schedule_args"`
	// AwaitChildren makes a task of the kind, once its command succeeded,
	// wait for the children it submitted: DONE when every child is DONE,
	// FAILED (for good) as soon as one is FAILED or CANCELLED. Its task
	// process waits, holding the lock, on the database's announcements.
	// Default false: the task is DONE when its command succeeds.
	AwaitChildren bool `yaml:"await_children"`
	// PassEnv names variables that the command gets from its task
	// process's environment although dama withholds them by default:
	// DATABASE_URL and libpq's PG* variables (PGPASSWORD among them),
	// which are dama's credentials. Names starting with DAMA_ are refused:
	// dama sets those a command gets. Empty, the default, passes none;
	// every other variable of the supervisor's environment is passed.
	PassEnv []string `yaml:"pass_env"`
}

// Withheld reports whether the environment variable name holds dama's own
// credentials or settings, which a command gets only when its kind names
// it in PassEnv (DAMA_* never).
func Withheld(name string) bool {
	return name == "DATABASE_URL" || strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "DAMA_")
}

// RetryPolicy says how long a failed attempt waits before the next.
type RetryPolicy struct {
	// MaxAttempts is the kind's max_attempts (either may be set; both
	// must then agree).
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff is "exponential" (the default: Delay, then twice as long
	// after each failure) or "fixed" (Delay after every failure).
	Backoff Backoff `yaml:"backoff"`
	// Delay is the wait after the first failure; default 1m.
	Delay Duration `yaml:"delay"`
	// MaxDelay caps an exponential backoff's wait; default 1h.
	MaxDelay Duration `yaml:"max_delay"`
}

// Backoff is how a retry's wait grows.
type Backoff string

// The backoffs.
const (
	BackoffExponential Backoff = "exponential"
	BackoffFixed       Backoff = "fixed"
)

// OnTimeout is what a timed-out attempt leads to.
type OnTimeout string

// What a timeout does.
const (
	OnTimeoutRetry OnTimeout = "retry"
	OnTimeoutFail  OnTimeout = "fail"
)

// Defaults of a retry policy.
const (
	DefaultRetryDelay    = time.Minute
	DefaultRetryMaxDelay = time.Hour
)

// RetryDelay is how long to wait after the failure of attempt (from 1)
// before the next; 0 means River's default backoff.
func (k Kind) RetryDelay(attempt int) time.Duration {
	p := k.Retry
	if p == nil {
		return 0
	}
	delay, maxDelay := p.Delay.D(), p.MaxDelay.D()
	if delay == 0 {
		delay = DefaultRetryDelay
	}
	if maxDelay == 0 {
		maxDelay = DefaultRetryMaxDelay
	}
	if p.Backoff == BackoffFixed {
		return delay
	}
	for i := 1; i < attempt && delay < maxDelay; i++ {
		// Doubling a wait past half of a cap near the longest Duration
		// would overflow into a negative one.
		if delay > maxDelay/2 {
			return maxDelay
		}
		delay *= 2
	}
	return min(delay, maxDelay)
}

// RetriesExit reports whether a command that exited with code is retried
// (while attempts remain), by RetryOnExitCodes and FailOnExitCodes.
func (k Kind) RetriesExit(code int) bool {
	if len(k.RetryOnExitCodes) > 0 {
		return slices.Contains(k.RetryOnExitCodes, code)
	}
	return !slices.Contains(k.FailOnExitCodes, code)
}

// KillGraceOf returns kind k's kill grace: its own, else the
// configuration's, else the default.
func (c *Config) KillGraceOf(k Kind) time.Duration {
	switch {
	case k.KillGrace != nil:
		return k.KillGrace.D()
	case c.KillGrace != 0:
		return c.KillGrace.D()
	}
	return DefaultKillGrace
}

// Duration is a time.Duration written as "5s" or "1m30s" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(node *yaml.Node) error {
	var s string
	if err := node.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as 5s: %w", node.Line, err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", node.Line, err)
	}
	*d = Duration(v)
	return nil
}

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,62}$`)
	keyPathRE = regexp.MustCompile(`^[^.]+(\.[^.]+)*$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ValidName reports whether name may name a queue or a kind.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	if path == "" {
		return nil, errors.New("no configuration file: pass --config or set DAMA_CONFIG")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve configuration path %s: %w", path, err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: %w", abs, err)
	}
	cfg.Path = abs
	if !filepath.IsAbs(cfg.LogDir) {
		cfg.LogDir = filepath.Join(filepath.Dir(abs), cfg.LogDir)
	}
	return cfg, nil
}

// Parse parses and validates a configuration document. Unknown fields are
// errors, so that a misspelt setting is not silently ignored.
func Parse(data []byte) (*Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	if cfg.LogDir == "" {
		return nil, errors.New("log_dir is required")
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = Duration(DefaultPollInterval)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = Duration(DefaultHeartbeatInterval)
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = Duration(DefaultKillGrace)
	}
	if cfg.PollInterval.D() < 100*time.Millisecond {
		return nil, errors.New("poll_interval must be at least 100ms")
	}
	if cfg.HeartbeatInterval.D() < 100*time.Millisecond {
		return nil, errors.New("heartbeat_interval must be at least 100ms")
	}
	if cfg.ReconnectGrace == nil {
		d := Duration(DefaultReconnectGrace)
		cfg.ReconnectGrace = &d
	}
	if cfg.ReconnectGrace.D() < 0 {
		return nil, errors.New("reconnect_grace must not be negative")
	}
	if cfg.KillGrace.D() < 0 {
		return nil, errors.New("kill_grace must not be negative")
	}
	if cfg.LockMode == "" {
		cfg.LockMode = DefaultLockMode
	}
	if err := cfg.LockMode.validate(); err != nil {
		return nil, err
	}
	if len(cfg.Kinds) == 0 {
		return nil, errors.New("no kinds: a supervisor with no kinds runs nothing")
	}
	if cfg.Queues == nil {
		cfg.Queues = map[string]Queue{}
	}
	for name, q := range cfg.Queues {
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("queue name %q: want letters, digits, '_', '.', '-', starting with a letter", name)
		}
		if q.MaxRunning < 0 {
			return nil, fmt.Errorf("queue %s: max_running must not be negative", name)
		}
		if q.MaxRunning == 0 {
			q.MaxRunning = DefaultMaxRunning
		}
		cfg.Queues[name] = q
	}
	for name, k := range cfg.Kinds {
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("kind name %q: want letters, digits, '_', '.', '-', starting with a letter", name)
		}
		switch {
		case k.Function != "" && len(k.Command) > 0:
			return nil, fmt.Errorf("kind %s: command and function exclude each other: set one", name)
		case k.Function != "":
			if !nameRE.MatchString(k.Function) {
				return nil, fmt.Errorf("kind %s: function name %q: want letters, digits, '_', '.', '-', starting with a letter", name, k.Function)
			}
			if len(k.RetryOnExitCodes) > 0 || len(k.FailOnExitCodes) > 0 {
				return nil, fmt.Errorf("kind %s: a function kind has no exit codes to list: its function returns taskrunner.NoRetry(err) to fail for good", name)
			}
		case len(k.Command) == 0 || k.Command[0] == "":
			return nil, fmt.Errorf("kind %s: command (or function) is required", name)
		}
		if k.Queue == "" {
			k.Queue = DefaultQueue
		}
		if _, ok := cfg.Queues[k.Queue]; !ok {
			if k.Queue != DefaultQueue {
				return nil, fmt.Errorf("kind %s: queue %s is not in queues", name, k.Queue)
			}
			cfg.Queues[DefaultQueue] = Queue{MaxRunning: DefaultMaxRunning}
		}
		if k.MaxAttempts < 0 {
			return nil, fmt.Errorf("kind %s: max_attempts must not be negative", name)
		}
		if err := k.validateFailures(); err != nil {
			return nil, fmt.Errorf("kind %s: %w", name, err)
		}
		if k.MaxAttempts == 0 {
			k.MaxAttempts = DefaultMaxAttempts
		}
		if k.MaxAttempts > attemptsLimit {
			return nil, fmt.Errorf("kind %s: max_attempts %d: at most %d", name, k.MaxAttempts, attemptsLimit)
		}
		if k.MaxRunning < 0 {
			return nil, fmt.Errorf("kind %s: max_running must not be negative", name)
		}
		if k.MaxRunningPerKey < 0 {
			return nil, fmt.Errorf("kind %s: max_running_per_key must not be negative", name)
		}
		if k.ConcurrencyKey == "" && k.MaxRunningPerKey > 0 {
			return nil, fmt.Errorf("kind %s: max_running_per_key needs concurrency_key", name)
		}
		if k.ConcurrencyKey != "" {
			if !keyPathRE.MatchString(k.ConcurrencyKey) {
				return nil, fmt.Errorf("kind %s: concurrency_key %q: want a field name, or names joined by '.'", name, k.ConcurrencyKey)
			}
			if k.MaxRunningPerKey == 0 {
				k.MaxRunningPerKey = DefaultMaxRunningPerKey
			}
		}
		for _, v := range k.PassEnv {
			switch {
			case !envNameRE.MatchString(v):
				return nil, fmt.Errorf("kind %s: pass_env %q: want a variable name (letters, digits, '_', not starting with a digit)", name, v)
			case strings.HasPrefix(v, "DAMA_"):
				return nil, fmt.Errorf("kind %s: pass_env %s: dama sets the DAMA_ variables a command gets", name, v)
			case !Withheld(v):
				return nil, fmt.Errorf("kind %s: pass_env %s: a command gets it anyway; pass_env names DATABASE_URL or PG* variables", name, v)
			}
		}
		if err := k.validateSchedule(); err != nil {
			return nil, fmt.Errorf("kind %s: %w", name, err)
		}
		if k.LockMode == "" {
			k.LockMode = cfg.LockMode
		}
		if err := k.LockMode.validate(); err != nil {
			return nil, fmt.Errorf("kind %s: %w", name, err)
		}
		cfg.Kinds[name] = k
	}
	return &cfg, nil
}

// ConcurrencyKeyOf returns the concurrency key of a task of kind k with
// the given arguments: nil when the kind has none, else the value of the
// field ConcurrencyKey names, as text (a string as itself, anything else as
// its JSON). It fails when the field is missing or null.
func (k Kind) ConcurrencyKeyOf(args json.RawMessage) (*string, error) {
	if k.ConcurrencyKey == "" {
		return nil, nil
	}
	var v any
	if len(args) > 0 {
		// Numbers as written: a float64 would round a large id.
		dec := json.NewDecoder(bytes.NewReader(args))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("arguments are not valid JSON: %w", err)
		}
	}
	for _, field := range strings.Split(k.ConcurrencyKey, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("the arguments have no field %s, the kind's concurrency_key", k.ConcurrencyKey)
		}
		v = obj[field]
	}
	var key string
	switch v := v.(type) {
	case nil:
		return nil, fmt.Errorf("the arguments have no field %s, the kind's concurrency_key", k.ConcurrencyKey)
	case string:
		key = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode concurrency key: %w", err)
		}
		key = string(b)
	}
	// The key is indexed while the task runs: a longer one would be
	// accepted now and refused at every launch.
	if len(key) > MaxConcurrencyKey {
		return nil, fmt.Errorf("the arguments' %s (the kind's concurrency_key) is %d bytes: at most %d", k.ConcurrencyKey, len(key), MaxConcurrencyKey)
	}
	return &key, nil
}

// MaxConcurrencyKey is the most bytes a task's concurrency key may hold.
const MaxConcurrencyKey = 512

// validateFailures checks the retry, exit code and timeout settings, and
// fills in their defaults.
func (k *Kind) validateFailures() error {
	if p := k.Retry; p != nil {
		switch {
		case p.MaxAttempts < 0:
			return errors.New("retry.max_attempts must not be negative")
		case p.MaxAttempts > 0 && k.MaxAttempts > 0 && p.MaxAttempts != k.MaxAttempts:
			return fmt.Errorf("max_attempts %d and retry.max_attempts %d disagree: set one", k.MaxAttempts, p.MaxAttempts)
		case p.Delay < 0 || p.MaxDelay < 0:
			return errors.New("retry delays must not be negative")
		}
		if p.MaxAttempts > 0 {
			k.MaxAttempts = p.MaxAttempts
		}
		switch p.Backoff {
		case "":
			p.Backoff = BackoffExponential
		case BackoffExponential, BackoffFixed:
		default:
			return fmt.Errorf("retry.backoff %q: want %q or %q", p.Backoff, BackoffFixed, BackoffExponential)
		}
		if p.Delay == 0 {
			p.Delay = Duration(DefaultRetryDelay)
		}
		if p.MaxDelay == 0 {
			p.MaxDelay = Duration(max(DefaultRetryMaxDelay, p.Delay.D()))
		}
		if p.MaxDelay < p.Delay {
			return fmt.Errorf("retry.max_delay %s is shorter than retry.delay %s", p.MaxDelay.D(), p.Delay.D())
		}
	}
	if len(k.RetryOnExitCodes) > 0 && len(k.FailOnExitCodes) > 0 {
		return errors.New("retry_on_exit_codes and fail_on_exit_codes exclude each other: set one")
	}
	for _, c := range append(slices.Clone(k.RetryOnExitCodes), k.FailOnExitCodes...) {
		if c < 1 || c > 255 {
			return fmt.Errorf("exit code %d: want 1 to 255 (0 is success)", c)
		}
	}
	if k.Timeout < 0 {
		return errors.New("timeout must not be negative")
	}
	switch k.OnTimeout {
	case "":
		k.OnTimeout = OnTimeoutRetry
	case OnTimeoutRetry, OnTimeoutFail:
	default:
		return fmt.Errorf("on_timeout %q: want %q or %q", k.OnTimeout, OnTimeoutRetry, OnTimeoutFail)
	}
	if k.KillGrace != nil && k.KillGrace.D() < 0 {
		return errors.New("kill_grace must not be negative")
	}
	return nil
}

// ReconnectGraceD returns reconnect_grace, or its default when the field
// was left nil by a hand-built Config.
func (c *Config) ReconnectGraceD() time.Duration {
	if c.ReconnectGrace == nil {
		return DefaultReconnectGrace
	}
	return c.ReconnectGrace.D()
}

// LockModeOf returns the lock mode of kind k: its own, else the
// configuration's, else the default (for a hand-built Config).
func (c *Config) LockModeOf(k Kind) LockMode {
	switch {
	case k.LockMode != "":
		return k.LockMode
	case c.LockMode != "":
		return c.LockMode
	}
	return DefaultLockMode
}

// Kind returns the configuration of the named kind and whether it exists.
func (c *Config) Kind(name string) (Kind, bool) {
	k, ok := c.Kinds[name]
	return k, ok
}

// QueueNames returns the configured queue names in order.
func (c *Config) QueueNames() []string {
	names := make([]string, 0, len(c.Queues))
	for n := range c.Queues {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Functions returns the names of the functions the function kinds name,
// in order, without repeats.
func (c *Config) Functions() []string {
	var names []string
	for _, k := range c.Kinds {
		if k.Function != "" && !slices.Contains(names, k.Function) {
			names = append(names, k.Function)
		}
	}
	sort.Strings(names)
	return names
}

// KindNames returns the configured kind names in order.
func (c *Config) KindNames() []string {
	names := make([]string, 0, len(c.Kinds))
	for n := range c.Kinds {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
