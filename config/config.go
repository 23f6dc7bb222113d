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
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
)

// attemptsLimit bounds max_attempts: River keeps a job's max_attempts in a
// smallint, and would silently cut a larger one down to this.
const attemptsLimit = math.MaxInt16

// LockMode says how a task process holds the lock that proves it runs:
// protocol.LockMode, part of the contract between a supervisor and the task
// processes it launches.
type LockMode = protocol.LockMode

// The lock modes (see protocol.LockModeRow, protocol.LockModeAdvisory and
// protocol.LockModeHost): advisory suits tasks that run for days, host
// hundreds of tasks on one host.
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

// Config is dama's configuration. Every field's comment gives its
// default: a field left unset (its zero value, or nil where zero means
// something) gets it from WithDefaults, the one place defaults are
// applied, and Validate, the one place settings are checked, refuses what
// is wrong. Parse and Load do both; a hand-built Config is given both by
// supervisor.New and dama.NewClient.
type Config struct {
	// Path is the absolute path of the file the configuration was read
	// from (Load sets it). A supervisor needs it: its task processes read
	// the configuration from there. Empty for a configuration not read from
	// a file.
	Path string `yaml:"-"`
	// LogDir holds one log file per task, <etl_context_id>.log. Required;
	// Load makes a relative one relative to the file. It and every
	// directory above it must be root's or the supervisor's user's, and
	// not writable by others (a sticky directory above it aside): a
	// supervisor refuses to start otherwise.
	LogDir string `yaml:"log_dir"`
	// LogGroup, when set (a group's name or number), is the group of
	// LogDir and of the log files in it, which may read them: a
	// supervisor gives the directory to it, set-group-ID. Empty keeps the
	// directory's group. Either way the directory is closed to other
	// users (0750), and the files to all but the group (0640).
	LogGroup string `yaml:"log_group"`
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
	// when it is cancelled or loses its lock. Default 10s (0 means the
	// default).
	KillGrace Duration `yaml:"kill_grace"`
	// ReconnectGrace is how long a task process keeps its command running
	// after losing its lock connection (a database restart, a failover, a
	// network cut) while it tries to take its lock again under the same run.
	// Past it, the command is stopped and the task retried. nil means the
	// default, 2m; 0 ("0s") stops the command as soon as the lock
	// connection fails.
	ReconnectGrace *Duration `yaml:"reconnect_grace"`
	// ProgressInterval is how often a task's progress and checkpoint are
	// stored as events: a PROGRESS or CHECKPOINT line that comes sooner
	// than this after the last one stored waits, replaced by any newer one,
	// until the interval is up, and the newest waiting checkpoint is stored
	// before the attempt's outcome. The context's latest progress, which
	// the view and the status page show, is updated at most once a second
	// in between. Default 10s (0 means the default), at most 1h.
	ProgressInterval Duration `yaml:"progress_interval"`
	// LogTailBytes is how much of each attempt's output (its log file's
	// lines since the attempt started) is also kept in the database, so
	// that dama logs and the status page read it from any host: the last
	// LogTailBytes, give or take one write's. Default 1 MiB (0 means the
	// default); a negative value (-1) keeps none; at most 64 MiB.
	LogTailBytes int64 `yaml:"log_tail_bytes"`
	// LogTailInterval is how often a task process writes what its log
	// gained to the database: at most one write per interval, none when
	// nothing was written, and the last before the attempt's outcome.
	// Default 5s (0 means the default), at least 100ms, at most 1h.
	LogTailInterval Duration `yaml:"log_tail_interval"`
	// Retention is how long a finished task is kept, with its events and
	// attempts and its River job, after it finished: the supervisors then
	// remove it (dama prune does it once). A task is removed only once it
	// has no child left. Default 720h, 30 days (0 means the default); a
	// negative value (-1s) keeps every task; at least 1s.
	Retention Duration `yaml:"retention"`
	// LockMode is how task processes hold their lock, "row", "advisory"
	// or "host"; a kind may override it. See LockModeRow,
	// LockModeAdvisory and LockModeHost: advisory suits tasks that run for
	// days, host many tasks on one host (no connection of their own).
	// Empty means the default, row.
	LockMode LockMode `yaml:"lock_mode"`
	// User and Group are the OS user (and group) the kinds' commands run
	// as; a kind may override them. See Kind.User.
	User  string `yaml:"user"`
	Group string `yaml:"group"`
	// Queues maps a queue name to its limits. A kind with no queue is in
	// the queue "default", which is added when it is missing.
	Queues map[string]Queue `yaml:"queues"`
	// Kinds maps a task kind to how it runs. At least one is required.
	Kinds map[string]Kind `yaml:"kinds"`
	// Kubernetes says where and how the kinds whose runner is kubernetes
	// run their pods.
	Kubernetes Kubernetes `yaml:"kubernetes"`
}

// Kubernetes configures the pods of the kinds that run on Kubernetes
// (Kind.Runner).
type Kubernetes struct {
	// Namespace is where the supervisor creates the task pods (and a
	// Secret beside each, which only dama's container of the pod mounts).
	// Default: the namespace of the supervisor's own pod, from its service
	// account, or "default" outside a cluster.
	Namespace string `yaml:"namespace"`
	// Image is dama's image (scripts/image.sh), of the supervisor's own
	// release: each task pod's init container copies its shim into the
	// user's container, and dama's container runs the task process from
	// it. Required when a kind runs on Kubernetes.
	Image string `yaml:"image"`
	// Resources is what each of dama's containers of a task pod (the
	// task process, and the init container that copies the shim) asks
	// for and is held to, a ResourceRequirements ({requests, limits}):
	// set it where a ResourceQuota or LimitRange wants other figures.
	// Default {requests: {cpu: 10m, memory: 32Mi}, limits: {memory:
	// 256Mi}}: a task process holds one or two connections and a few
	// buffers. Checked by the supervisor.
	Resources JSONObject `yaml:"resources"`
	// TLSSecret names a Secret of the task pods' namespace that each
	// task pod mounts, read-only, in dama's container only, at
	// /var/run/dama/tls: the files its database URL names
	// (sslmode=verify-full&sslrootcert=/var/run/dama/tls/ca.crt). The
	// command shares the pod's network and, as root, its /etc/hosts and
	// resolv.conf: only a server that the task process verifies, or
	// names by address, is surely the database. Default: none.
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
	// supervisor sharing the database. Default 10 (0 means the default).
	MaxRunning int `yaml:"max_running"`
}

// Kind says how the tasks of one kind run.
type Kind struct {
	// Queue is the queue the kind's tasks wait in. Default "default".
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
	// default 3 (0 means the default), at most 32767. Retry.MaxAttempts is
	// the same setting.
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
	// nil means the configuration's, and 0 ("0s") SIGKILL at once.
	KillGrace *Duration `yaml:"kill_grace"`
	// LockMode overrides the configuration's lock_mode for this kind; empty
	// means the configuration's.
	LockMode LockMode `yaml:"lock_mode"`
	// Runner is where the kind's tasks run: "host" (the default), a
	// process of the supervisor's host, or "kubernetes", a pod of their
	// own for each attempt, made from Pod (see docs/kubernetes.md). A
	// kubernetes kind has a command, no function and no user, and its
	// lock mode is row or advisory.
	Runner string `yaml:"runner"`
	// Pod is a kubernetes kind's pod template, a PodTemplateSpec
	// (metadata and spec) in YAML: its container named "task" runs the
	// command under dama's shim, with the container's image, resources,
	// environment, volumes and security context; the spec's service
	// account, node selector, tolerations and volumes are the pod's.
	// Checked by the supervisor, which knows Kubernetes' types. Required
	// for a kubernetes kind.
	Pod JSONObject `yaml:"pod"`
	// StartTimeout bounds how long a kubernetes kind's pod may take from
	// its creation to its command's start (scheduling, image pulls): past
	// it the pod is deleted and the launch given back, spending no
	// attempt. Default 5m (0 means the default), at most 24h.
	StartTimeout Duration `yaml:"start_timeout"`
	// PodRetention is how long a kubernetes kind's finished pod is kept
	// (for kubectl logs and describe) before the supervisor deletes it.
	// nil means the configuration's retention; 0 ("0s") deletes it once
	// its task process recorded the outcome.
	PodRetention *Duration `yaml:"pod_retention"`
	// User is the OS user (a name or a number) the command runs as, with
	// that user's uid, gid and groups only, its HOME, USER and LOGNAME,
	// and no capability, so that the kernel keeps it from dama's
	// processes, logs and lock keeper. Group, when set, is its group
	// instead of the user's own. Empty means the configuration's user, and
	// when that is empty too, dama's own user: a supervisor running as
	// root then refuses the kind (user: root says so on purpose). Switching
	// users needs root, or CAP_SETUID, CAP_SETGID and CAP_KILL.
	User  string `yaml:"user"`
	Group string `yaml:"group"`
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
	// unfinished: "skip" (the default of a scheduled kind), "queue" or
	// "allow"; see Overlap. "queue" makes the default max_running 1.
	Overlap Overlap `yaml:"overlap"`
	// ScheduleArgs are the arguments of the tasks a tick submits, a
	// mapping; default {} for a scheduled kind.
	ScheduleArgs JSONObject `yaml:"schedule_args"`
	// AwaitChildren makes a task of the kind, once its command succeeded,
	// wait for the children it submitted: DONE when every child is DONE,
	// FAILED (for good) as soon as one is FAILED or CANCELLED. Its task
	// process waits, holding the lock, on the database's announcements.
	// Default false: the task is DONE when its command succeeds.
	AwaitChildren bool `yaml:"await_children"`
	// Children names the kinds the kind's tasks may submit as children
	// (a submit line, task.Submit): the kind's command, which may run as
	// another user than theirs, chooses their arguments. A child of any
	// other kind is refused, by the task process and by the database, with
	// a WARNING; the task goes on. Empty, the default, allows none.
	Children []string `yaml:"children"`
	// PassEnv names variables that the command gets from its task
	// process's environment although dama withholds them by default:
	// DATABASE_URL and libpq's PG* variables (PGPASSWORD among them),
	// which are dama's credentials. Names starting with DAMA_ are refused:
	// dama sets those a command gets. Empty, the default, passes none;
	// every other variable of the supervisor's environment is passed.
	PassEnv []string `yaml:"pass_env"`
	// SessionFence, true by default (nil), names the command's libpq
	// sessions by its run (PGAPPNAME, unless PassEnv passes one) and asks
	// their server to end a statement whose client is gone within a
	// second (client_connection_check_interval, appended to PGOPTIONS):
	// the task's next attempt waits until no session of that run is left
	// on dama's server. false, for a command whose libpq server refuses
	// that setting (PostgreSQL before 14, or another that speaks its
	// protocol), sets neither: its sessions are not named, and a retry
	// finds none to wait for.
	SessionFence *bool `yaml:"session_fence"`
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
	// MaxAttempts is the kind's max_attempts (either may be set; both
	// must then agree). The defaults set both.
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff is "exponential" (Delay, then twice as long after each
	// failure) or "fixed" (Delay after every failure). Empty means the
	// default, exponential.
	Backoff Backoff `yaml:"backoff"`
	// Delay is the wait after the first failure; default 1m (0 means the
	// default).
	Delay Duration `yaml:"delay"`
	// MaxDelay caps an exponential backoff's wait; default 1h, or Delay
	// when that is longer (0 means the default).
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
// (data_manager.concurrency_key_of: a string as itself, anything else as
// jsonb prints it), whoever submits: this checks arguments before they
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
	for _, field := range strings.Split(k.ConcurrencyKey, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("the arguments have no field %s, the kind's concurrency_key", k.ConcurrencyKey)
		}
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

// Settings returns k as JSON, under the names of the configuration file,
// durations as Go writes them ("1h30m0s"): what a supervisor publishes of
// the kind in data_manager.kinds for readers. Every setting is there,
// defaults included; pass_env names variables, never their values.
func (k Kind) Settings() (json.RawMessage, error) {
	duration := func(d *Duration) *string {
		if d == nil {
			return nil
		}
		s := d.String()
		return &s
	}
	var retry any
	if p := k.Retry; p != nil {
		retry = struct {
			MaxAttempts int     `json:"max_attempts"`
			Backoff     Backoff `json:"backoff"`
			Delay       string  `json:"delay"`
			MaxDelay    string  `json:"max_delay"`
		}{p.MaxAttempts, p.Backoff, p.Delay.String(), p.MaxDelay.String()}
	}
	b, err := json.Marshal(struct {
		Queue            string          `json:"queue"`
		Command          []string        `json:"command,omitempty"`
		Function         string          `json:"function,omitempty"`
		MaxAttempts      int             `json:"max_attempts"`
		Retry            any             `json:"retry,omitempty"`
		RetryOnExitCodes []int           `json:"retry_on_exit_codes,omitempty"`
		FailOnExitCodes  []int           `json:"fail_on_exit_codes,omitempty"`
		Timeout          *string         `json:"timeout,omitempty"`
		OnTimeout        OnTimeout       `json:"on_timeout,omitempty"`
		KillGrace        *string         `json:"kill_grace,omitempty"`
		LockMode         LockMode        `json:"lock_mode,omitempty"`
		MaxRunning       int             `json:"max_running,omitempty"`
		ConcurrencyKey   string          `json:"concurrency_key,omitempty"`
		MaxRunningPerKey int             `json:"max_running_per_key,omitempty"`
		Schedule         string          `json:"schedule,omitempty"`
		Timezone         string          `json:"timezone,omitempty"`
		Overlap          Overlap         `json:"overlap,omitempty"`
		ScheduleArgs     json.RawMessage `json:"schedule_args,omitempty"`
		AwaitChildren    bool            `json:"await_children,omitempty"`
		Children         []string        `json:"children,omitempty"`
		PassEnv          []string        `json:"pass_env,omitempty"`
		SessionFence     bool            `json:"session_fence"`
		User             string          `json:"user,omitempty"`
		Group            string          `json:"group,omitempty"`
	}{
		k.Queue, k.Command, k.Function, k.MaxAttempts, retry, k.RetryOnExitCodes, k.FailOnExitCodes,
		duration(&k.Timeout), k.OnTimeout, duration(k.KillGrace), k.LockMode, k.MaxRunning, k.ConcurrencyKey,
		k.MaxRunningPerKey, k.Schedule, k.Timezone, k.Overlap, json.RawMessage(k.ScheduleArgs), k.AwaitChildren, k.Children, k.PassEnv,
		k.FencesSessions(), k.User, k.Group,
	})
	if err != nil {
		return nil, fmt.Errorf("encode the settings of a kind: %w", err)
	}
	return b, nil
}
