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
	"io/fs"
	"maps"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
)

// attemptsLimit bounds max_attempts: River keeps a job's max_attempts in a
// smallint, and would silently cut a larger one down to this.
const attemptsLimit = math.MaxInt16

// LockMode says how a task process holds the lock that proves it runs
// (protocol.LockMode).
type LockMode = protocol.LockMode

// The lock modes: advisory suits tasks that run for days, host hundreds of
// tasks on one host.
const (
	LockModeRow      = protocol.LockModeRow
	LockModeAdvisory = protocol.LockModeAdvisory
	LockModeHost     = protocol.LockModeHost
)

// validLockMode says what is wrong with m, if anything.
func validLockMode(m LockMode) error {
	if !m.Valid() {
		return fmt.Errorf("lock_mode %q: want %q, %q or %q", m, LockModeRow, LockModeAdvisory, LockModeHost)
	}
	return nil
}

// Config is dama's configuration (docs/configuration.md). A field left
// unset (its zero value, or nil where zero means something) gets the
// default its comment gives from WithDefaults; Validate refuses what is
// wrong. Parse and Load do both, as supervisor.New and dama.NewClient do
// to a hand-built Config.
type Config struct {
	// Path is the absolute path of the file the configuration was read
	// from (Load sets it), whence a supervisor's task processes read it
	// again; empty for a configuration not read from a file.
	Path string `yaml:"-"`
	// LogDir holds one log file per task, <etl_context_id>.log. Required;
	// Load makes a relative one relative to the file. It and every
	// directory above it must be root's or the supervisor's user's and not
	// writable by others (a sticky directory above it aside).
	LogDir string `yaml:"log_dir"`
	// LogGroup, when set (a name or a number), is given LogDir, set-group-ID,
	// so that it may read the logs. Either way the directory is made 0750
	// and the files 0640.
	LogGroup string `yaml:"log_group"`
	// PollInterval is how often the supervisor looks at the locks of every
	// running task, rescues the steps of dead supervisors and reconciles
	// contexts with their jobs. Default 5s.
	PollInterval Duration `yaml:"poll_interval"`
	// HeartbeatInterval is how long a task process's lock connection may be
	// silent before the kernel probes it (TCP keepalive): nothing is
	// written, the lock is the proof of life. Default 5s.
	HeartbeatInterval Duration `yaml:"heartbeat_interval"`
	// KillGrace is how long a task's command has between SIGTERM and SIGKILL
	// when it is cancelled or loses its lock. Default 10s.
	KillGrace Duration `yaml:"kill_grace"`
	// ReconnectGrace is how long a task process keeps its command running
	// after losing its lock connection, while it tries to take its lock
	// again under the same run; past it, the command is stopped and the
	// task retried. nil means 2m; 0 stops the command at once.
	ReconnectGrace *Duration `yaml:"reconnect_grace"`
	// ProgressInterval is how often a task's progress and checkpoint are
	// stored as events: a newer line replaces one that waits for the
	// interval, and the newest waiting checkpoint is stored before the
	// attempt's outcome. Default 10s, at most 1h.
	ProgressInterval Duration `yaml:"progress_interval"`
	// LogTailBytes is how much of each attempt's output (the last bytes,
	// give or take one write's) is also kept in the database, for dama
	// logs and the status page on any host. Default 1 MiB; -1 keeps none;
	// at most 64 MiB.
	LogTailBytes int64 `yaml:"log_tail_bytes"`
	// LogTailInterval is how often a task process writes what its log
	// gained to the database, and once more before the attempt's outcome.
	// Default 5s, from 100ms to 1h.
	LogTailInterval Duration `yaml:"log_tail_interval"`
	// Retention is how long a finished task (its events, attempts and
	// River job) is kept once it and all its children finished. Default
	// 720h (30 days); -1s keeps every task; at least 1s.
	Retention Duration `yaml:"retention"`
	// LockMode is how task processes hold their lock, "row" (the default),
	// "advisory" or "host"; a kind may override it.
	LockMode LockMode `yaml:"lock_mode"`
	// User and Group are the OS user (and group) the kinds' commands run
	// as; a kind may override them. See Kind.User.
	User  string `yaml:"user"`
	Group string `yaml:"group"`
	// Resources is the default of the host kinds' resources: none.
	Resources *Resources `yaml:"resources"`
	// CgroupParent is the control group, as /dama, under which each
	// attempt on this host gets a group of its own, named by its run (on
	// cgroup v1, the same path under each controller's hierarchy); it
	// must exist and be writable by the supervisor's user. Empty, the
	// default, means the cgroup systemd delegated to the supervisor's unit
	// (Delegate=yes) where there is one, and else none: attempts then run
	// in no group of their own, a kind with resources is refused, and
	// the processes an attempt leaves are found through /proc.
	CgroupParent string `yaml:"cgroup_parent"`
	// Queues maps a queue name to its limits. The queue "default" is added
	// when it is missing.
	Queues map[string]Queue `yaml:"queues"`
	// Kinds maps a task kind to how it runs. At least one is required.
	Kinds map[string]Kind `yaml:"kinds"`
	// Kubernetes configures the pods of the kinds that run on Kubernetes.
	Kubernetes Kubernetes `yaml:"kubernetes"`
}

// Kubernetes configures the pods of the kinds that run on Kubernetes
// (Kind.Runner); see docs/kubernetes.md.
type Kubernetes struct {
	// Namespace is where the task pods and their Secrets are created.
	// Default: the supervisor's own pod's, or "default" outside a cluster.
	Namespace string `yaml:"namespace"`
	// Image is dama's image of the supervisor's own release, whose shim
	// each task pod copies into the user's container, and whose task
	// process it runs. Required by a supervisor of a kind that runs on
	// Kubernetes, which else takes $DAMA_IMAGE (the supervisor's own
	// image, in deploy/kubernetes).
	Image string `yaml:"image"`
	// Resources is what each of dama's containers of a task pod asks for
	// and is held to, a ResourceRequirements. Default {requests: {cpu: 10m,
	// memory: 32Mi}, limits: {memory: 256Mi}}. Checked by the supervisor.
	Resources JSONObject `yaml:"resources"`
	// TLSSecret names a Secret mounted read-only, in dama's container only,
	// at /var/run/dama/tls, for the files its database URL names: the
	// command shares the pod's network and, as root, its /etc/hosts, so
	// only a server that the task process verifies, or names by address,
	// is surely the database. Default: none.
	TLSSecret string `yaml:"tls_secret"`
}

// The runners of a kind (Kind.Runner).
const (
	// RunnerHost runs a task as a process of the supervisor's host.
	RunnerHost = "host"
	// RunnerKubernetes runs each attempt of a task in a pod of its own.
	RunnerKubernetes = "kubernetes"
)

// Queue holds the limits of one queue.
type Queue struct {
	// MaxRunning bounds the tasks of this queue running at once, across every
	// supervisor sharing the database. Default 10.
	MaxRunning int `yaml:"max_running"`
}

// Kind says how the tasks of one kind run.
type Kind struct {
	// Queue is the queue the kind's tasks wait in. Default "default".
	Queue string `yaml:"queue" json:"queue"`
	// Command is the program and its arguments, executed directly, never
	// through a shell. A kind has a command or a function, not both.
	Command []string `yaml:"command" json:"command,omitempty"`
	// Function names a Go function that the program embedding the
	// supervisor registers (supervisor.Options.Funcs): only that program's
	// supervisor runs the kind, its task process calling the function.
	Function string `yaml:"function" json:"function,omitempty"`
	// MaxAttempts is how many times a task is started before it is FAILED;
	// default 3, at most 32767. Retry.MaxAttempts is the same setting.
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts"`
	// Retry is when a failed attempt is tried again; nil means River's
	// default backoff (attempt⁴ seconds, with jitter).
	Retry *RetryPolicy `yaml:"retry" json:"retry,omitempty"`
	// RetryOnExitCodes, when set, lists the only exit codes after which the
	// task is retried; FailOnExitCodes those after which it fails for good.
	// At most one of the two is set; by default every failure is retried.
	RetryOnExitCodes []int `yaml:"retry_on_exit_codes" json:"retry_on_exit_codes,omitempty"`
	FailOnExitCodes  []int `yaml:"fail_on_exit_codes" json:"fail_on_exit_codes,omitempty"`
	// Timeout bounds the wall time of one attempt's command; 0, the
	// default, means none: tasks that run for days are normal. A command
	// that runs longer is stopped, with a TIMEOUT event; OnTimeout says
	// whether the task is then retried ("retry", the default) or FAILED.
	Timeout   Duration  `yaml:"timeout" json:"timeout"`
	OnTimeout OnTimeout `yaml:"on_timeout" json:"on_timeout,omitempty"`
	// StallAfter marks a running task stalled once its command has
	// reported nothing for that long: no line on its events pipe, no
	// output to its log. 0, the default, watches for none; else at least
	// 1s. OnStall says whether the mark only warns ("warn", the default)
	// or also stops the command as a timeout does, to be retried from its
	// checkpoint ("kill"), whatever OnTimeout says.
	StallAfter Duration `yaml:"stall_after" json:"stall_after,omitempty"`
	OnStall    OnStall  `yaml:"on_stall" json:"on_stall,omitempty"`
	// KillGrace overrides the configuration's kill_grace; 0 is SIGKILL at once.
	KillGrace *Duration `yaml:"kill_grace" json:"kill_grace,omitempty"`
	// LockMode overrides the configuration's lock_mode.
	LockMode LockMode `yaml:"lock_mode" json:"lock_mode,omitempty"`
	// Runner is where the kind's tasks run: RunnerHost (the default) or
	// RunnerKubernetes, whose kinds have a command, no function and no user,
	// and lock mode row or advisory.
	Runner string `yaml:"runner" json:"-"`
	// Pod is a kubernetes kind's pod template, a PodTemplateSpec: its
	// container named "task" runs the command under dama's shim. Checked by
	// the supervisor, which knows Kubernetes' types. Required for a
	// kubernetes kind.
	Pod JSONObject `yaml:"pod" json:"-"`
	// StartTimeout bounds how long a kubernetes kind's pod may take from its
	// creation to its command's start: past it the pod is deleted and the
	// launch given back, spending no attempt. Default 5m, at most 24h.
	StartTimeout Duration `yaml:"start_timeout" json:"-"`
	// PodRetention is how long a kubernetes kind's finished pod is kept
	// before the supervisor deletes it. nil means the configuration's
	// retention; 0 deletes it once its outcome is recorded.
	PodRetention *Duration `yaml:"pod_retention" json:"-"`
	// User is the OS user (a name or a number) the command runs as, with
	// its uid, gid and groups only, its HOME, USER and LOGNAME, and no
	// capability, so that the kernel keeps it from dama's processes, logs
	// and lock keeper; Group replaces the user's own group. Empty means the
	// configuration's user, and then dama's own, which a supervisor running
	// as root refuses (user: root says so on purpose).
	User  string `yaml:"user" json:"user,omitempty"`
	Group string `yaml:"group" json:"group,omitempty"`
	// MaxRunning bounds the tasks of this kind running at once, across
	// every supervisor and queue. 0, the default, means the queue's bound
	// only.
	MaxRunning int `yaml:"max_running" json:"max_running,omitempty"`
	// ConcurrencyKey names a field of the task's arguments ("region", or
	// "source.region" inside an object): tasks of the kind with the same
	// value run at most MaxRunningPerKey at a time. A submission whose
	// arguments lack the field is refused. Empty, the default, means none.
	ConcurrencyKey string `yaml:"concurrency_key" json:"concurrency_key,omitempty"`
	// MaxRunningPerKey bounds the running tasks of each concurrency key;
	// default 1 when ConcurrencyKey is set.
	MaxRunningPerKey int `yaml:"max_running_per_key" json:"max_running_per_key,omitempty"`
	// Schedule makes the kind periodic: a cron expression (ParseSchedule).
	// At each tick one of the supervisors that configure the kind submits
	// one task; ticks missed while none ran give one task.
	Schedule string `yaml:"schedule" json:"schedule,omitempty"`
	// Timezone is the IANA time zone the schedule is read in; default UTC.
	Timezone string `yaml:"timezone" json:"timezone,omitempty"`
	// Overlap is what a tick does while an earlier task of the kind is
	// unfinished: "skip" (the default), "queue" or "allow". "queue" makes
	// the default max_running 1.
	Overlap Overlap `yaml:"overlap" json:"overlap,omitempty"`
	// ScheduleArgs are the arguments of the tasks a tick submits, a
	// mapping; default {} for a scheduled kind.
	ScheduleArgs JSONObject `yaml:"schedule_args" json:"schedule_args,omitempty"`
	// AwaitChildren makes a task whose command succeeded wait, holding its
	// lock, for the children it submitted: DONE when every child is DONE,
	// FAILED (for good) as soon as one is FAILED or CANCELLED.
	AwaitChildren bool `yaml:"await_children" json:"await_children,omitempty"`
	// Children names the kinds the kind's tasks may submit as children
	// (task.Submit), whose arguments the kind's command, maybe of another
	// user than theirs, chooses. Any other child is refused with a WARNING.
	Children []string `yaml:"children" json:"children,omitempty"`
	// PassEnv names variables, withheld by default as dama's credentials
	// (DATABASE_URL and libpq's PG* variables), that the command gets from
	// its task process's environment; DAMA_* are refused. Every other
	// variable of the supervisor's environment is passed.
	PassEnv []string `yaml:"pass_env" json:"pass_env,omitempty"`
	// SessionFence, true by default (nil), names the command's libpq
	// sessions by its run (PGAPPNAME, unless PassEnv passes one) and asks
	// their server to end a statement whose client is gone (PGOPTIONS):
	// the task's next attempt waits until no session of that run is left.
	// false suits a server that refuses that setting (PostgreSQL before 14).
	SessionFence *bool `yaml:"session_fence" json:"session_fence"`
	// Resources bound each attempt of a host kind (see Resources); nil
	// means the configuration's resources.
	Resources *Resources `yaml:"resources" json:"resources,omitempty"`
}

// FencesSessions reports whether k's command's sessions are named by its
// run and waited for (SessionFence).
func (k Kind) FencesSessions() bool { return k.SessionFence == nil || *k.SessionFence }

// FindCommand returns the path of the kind's command (Command[0], looked
// for in PATH unless it names a directory), or why it cannot be run, in
// a line that names it: "/opt/etl/tool not found".
func (k Kind) FindCommand() (string, error) {
	if len(k.Command) == 0 {
		return "", errors.New("the kind has no command")
	}
	name := k.Command[0]
	path, err := exec.LookPath(name)
	switch {
	case err == nil:
		return path, nil
	case errors.Is(err, exec.ErrNotFound):
		return "", fmt.Errorf("%s not found in PATH (%s)", name, os.Getenv("PATH"))
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%s not found", name)
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("%s is not executable", name)
	}
	return "", fmt.Errorf("%s: %w", name, err)
}

// Withheld reports whether the environment variable name holds dama's own
// credentials or settings, which a command gets only when its kind names
// it in PassEnv (DAMA_* never).
func Withheld(name string) bool {
	return protocol.DatabaseVar(name) || strings.HasPrefix(name, "DAMA_")
}

// RetryPolicy says how long a failed attempt waits before the next.
type RetryPolicy struct {
	// MaxAttempts is the kind's max_attempts: either may be set, or both,
	// to one value.
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts"`
	// Backoff is "exponential" (the default: Delay, then twice as long
	// after each failure) or "fixed".
	Backoff Backoff `yaml:"backoff" json:"backoff"`
	// Delay is the wait after the first failure; default 1m.
	Delay Duration `yaml:"delay" json:"delay"`
	// MaxDelay caps an exponential backoff's wait; default 1h, or Delay
	// when that is longer.
	MaxDelay Duration `yaml:"max_delay" json:"max_delay"`
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

// OnStall is what a stalled attempt leads to.
type OnStall string

// What a stall does.
const (
	OnStallWarn OnStall = "warn"
	OnStallKill OnStall = "kill"
)

// RetryDelay is how long to wait after the failure of attempt (from 1)
// before the next, by k's retry policy with its defaults applied (Parse
// or WithDefaults); 0 means River's default backoff.
func (k Kind) RetryDelay(attempt int) time.Duration {
	p := k.Retry
	if p == nil {
		return 0
	}
	delay, maxDelay := time.Duration(p.Delay), time.Duration(p.MaxDelay)
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

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,62}$`)
	keyPathRE = regexp.MustCompile(`^[^.]+(\.[^.]+)*$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// userNameRE is what a user's or group's name may be: useradd's
	// portable names, and numbers (dama reads /etc/passwd and /etc/group,
	// no directory service).
	userNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$`)
)

// ValidName reports whether name may name a queue or a kind.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// CheckConcurrencyKey reports whether arguments give a task of kind k a
// concurrency key: nil when the kind has none, or when the field
// ConcurrencyKey names holds a value (not null) of at most
// MaxConcurrencyKey bytes. The key itself is the database's to say
// (data_manager.concurrency_key_of); this checks arguments before they
// reach it, a schedule's when the configuration is read.
func (k Kind) CheckConcurrencyKey(args json.RawMessage) error {
	if k.ConcurrencyKey == "" {
		return nil
	}
	var v any
	if len(args) > 0 {
		// Numbers as written: a float64 would round a large id.
		dec := json.NewDecoder(bytes.NewReader(args))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("arguments are not valid JSON: %w", err)
		}
	}
	for field := range strings.SplitSeq(k.ConcurrencyKey, ".") {
		obj, _ := v.(map[string]any) // nil, and so no field, when v is no object
		v = obj[field]
	}
	var key string
	switch v := v.(type) {
	case nil:
		return fmt.Errorf("the arguments have no field %s, the kind's concurrency_key", k.ConcurrencyKey)
	case string:
		key = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode concurrency key: %w", err)
		}
		key = string(b)
	}
	// The key is indexed while the task runs: a longer one would be
	// accepted now and refused at every launch.
	if len(key) > MaxConcurrencyKey {
		return fmt.Errorf("the arguments' %s (the kind's concurrency_key) is %d bytes: at most %d", k.ConcurrencyKey, len(key), MaxConcurrencyKey)
	}
	return nil
}

// MaxConcurrencyKey is the most bytes a task's concurrency key may hold.
const MaxConcurrencyKey = 512

// Kind returns the configuration of the named kind and whether it exists.
func (c *Config) Kind(name string) (Kind, bool) {
	k, ok := c.Kinds[name]
	return k, ok
}

// QueueNames returns the configured queue names in order.
func (c *Config) QueueNames() []string { return slices.Sorted(maps.Keys(c.Queues)) }

// KindNames returns the configured kind names in order.
func (c *Config) KindNames() []string { return slices.Sorted(maps.Keys(c.Kinds)) }

// Functions returns the names of the functions the function kinds name,
// in order, without repeats.
func (c *Config) Functions() []string {
	var names []string
	for _, k := range c.Kinds {
		if k.Function != "" {
			names = append(names, k.Function)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Settings returns k as JSON, under the names of the configuration file,
// durations as Go writes them ("1h30m0s"): what a supervisor publishes of
// the kind in data_manager.kinds for readers. Every setting but the
// kubernetes runner's is there, defaults included; pass_env names
// variables, never their values.
func (k Kind) Settings() (json.RawMessage, error) {
	fence := k.FencesSessions()
	k.SessionFence = &fence
	b, err := json.Marshal(k)
	if err != nil {
		return nil, fmt.Errorf("encode the settings of a kind: %w", err)
	}
	return b, nil
}
