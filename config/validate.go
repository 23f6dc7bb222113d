package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
)

// minInterval is the shortest poll_interval, heartbeat_interval and
// log_tail_interval.
const minInterval = Duration(100 * time.Millisecond)

// Validate reports the first setting of c that is wrong, in one line that
// names it: the one place settings are checked. It expects c's defaults
// applied (WithDefaults): an unset field is wrong for it.
func (c *Config) Validate() error {
	if c.LogDir == "" {
		return errors.New("log_dir is required")
	}
	if c.ReconnectGrace == nil {
		return errors.New("reconnect_grace must not be negative")
	}
	for _, d := range []struct {
		name              string
		value, least, max Duration
	}{
		{"poll_interval", c.PollInterval, minInterval, MaxPollInterval},
		{"heartbeat_interval", c.HeartbeatInterval, minInterval, MaxHeartbeatInterval},
		{"reconnect_grace", *c.ReconnectGrace, 0, MaxReconnectGrace},
		{"kill_grace", c.KillGrace, 0, MaxKillGrace},
		{"progress_interval", c.ProgressInterval, 0, MaxProgressInterval},
		{"log_tail_interval", c.LogTailInterval, minInterval, MaxLogTailInterval},
	} {
		switch {
		case d.value < 0 && d.least == 0:
			return fmt.Errorf("%s must not be negative", d.name)
		case d.value < d.least:
			return fmt.Errorf("%s must be at least %s", d.name, d.least)
		case d.value > d.max:
			return fmt.Errorf("%s %s: at most %s", d.name, d.value, d.max)
		}
	}
	if c.LogTailBytes > MaxLogTailBytes {
		return fmt.Errorf("log_tail_bytes %d: at most %d (64 MiB; a negative one keeps none)", c.LogTailBytes, MaxLogTailBytes)
	}
	if c.Retention > 0 && c.Retention < Duration(time.Second) {
		return fmt.Errorf("retention %s: at least 1s (a negative one keeps every task)", c.Retention)
	}
	if c.Retention > MaxDelay {
		return fmt.Errorf("retention %s: at most %s", c.Retention, MaxDelay)
	}
	if err := validLockMode(c.LockMode); err != nil {
		return err
	}
	if p := c.CgroupParent; p != "" && (!path.IsAbs(p) || path.Clean(p) != p || p == "/") {
		return fmt.Errorf("cgroup_parent %q: want a control group's absolute path, as /dama", p)
	}
	if len(c.Kinds) == 0 {
		return errors.New("no kinds: a supervisor with no kinds runs nothing")
	}
	for _, name := range c.QueueNames() {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("queue name %q: want letters, digits, '_', '.', '-', starting with a letter", name)
		}
		if c.Queues[name].MaxRunning < 0 {
			return fmt.Errorf("queue %s: max_running must not be negative", name)
		}
	}
	for _, name := range c.KindNames() {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("kind name %q: want letters, digits, '_', '.', '-', starting with a letter", name)
		}
		k := c.Kinds[name]
		if _, ok := c.Queues[k.Queue]; !ok {
			return fmt.Errorf("kind %s: queue %s is not in queues", name, k.Queue)
		}
		if err := k.validate(); err != nil {
			return fmt.Errorf("kind %s: %w", name, err)
		}
		for _, child := range k.Children {
			if _, ok := c.Kinds[child]; !ok {
				return fmt.Errorf("kind %s: children: %q is not a kind of this configuration (%s)", name, child, strings.Join(c.KindNames(), ", "))
			}
		}
	}
	return nil
}

// Runs reports whether a kind of c has runner.
func (c *Config) Runs(runner string) bool {
	for _, k := range c.Kinds {
		if k.Runner == runner {
			return true
		}
	}
	return false
}

// validate checks a kind's own settings.
func (k *Kind) validate() error {
	switch {
	case k.Function != "" && len(k.Command) > 0:
		return errors.New("command and function exclude each other: set one")
	case k.Function != "":
		if !nameRE.MatchString(k.Function) {
			return fmt.Errorf("function name %q: want letters, digits, '_', '.', '-', starting with a letter", k.Function)
		}
		if len(k.RetryOnExitCodes) > 0 || len(k.FailOnExitCodes) > 0 {
			return errors.New("a function kind has no exit codes to list: its function returns taskrunner.NoRetry(err) to fail for good")
		}
	case len(k.Command) == 0 || k.Command[0] == "":
		return errors.New("command (or function) is required")
	}
	if k.MaxAttempts < 0 {
		return errors.New("max_attempts must not be negative")
	}
	if err := k.validateFailures(); err != nil {
		return err
	}
	switch {
	case k.MaxAttempts == 0:
		return errors.New("max_attempts must be set")
	case k.MaxAttempts > attemptsLimit:
		return fmt.Errorf("max_attempts %d: at most %d", k.MaxAttempts, attemptsLimit)
	case k.MaxRunning < 0:
		return errors.New("max_running must not be negative")
	case k.MaxRunningPerKey < 0:
		return errors.New("max_running_per_key must not be negative")
	case k.ConcurrencyKey == "" && k.MaxRunningPerKey > 0:
		return errors.New("max_running_per_key needs concurrency_key")
	case k.ConcurrencyKey != "" && !keyPathRE.MatchString(k.ConcurrencyKey):
		return fmt.Errorf("concurrency_key %q: want a field name, or names joined by '.'", k.ConcurrencyKey)
	}
	for _, v := range k.PassEnv {
		switch {
		case !envNameRE.MatchString(v):
			return fmt.Errorf("pass_env %q: want a variable name (letters, digits, '_', not starting with a digit)", v)
		case strings.HasPrefix(v, "DAMA_"):
			return fmt.Errorf("pass_env %s: dama sets the DAMA_ variables a command gets", v)
		case !Withheld(v):
			return fmt.Errorf("pass_env %s: a command gets it anyway; pass_env names DATABASE_URL or PG* variables", v)
		}
	}
	for name, v := range map[string]string{"user": k.User, "group": k.Group} {
		if v != "" && !userNameRE.MatchString(v) {
			return fmt.Errorf("%s %q: want a name or a number of this host's", name, v)
		}
	}
	if k.Group != "" && k.User == "" {
		return fmt.Errorf("group %s needs a user", k.Group)
	}
	if err := k.validateSchedule(); err != nil {
		return err
	}
	if err := validLockMode(k.LockMode); err != nil {
		return err
	}
	return k.validateRunner()
}

// validateRunner checks the kind's runner and its settings.
func (k *Kind) validateRunner() error {
	switch k.Runner {
	case RunnerHost:
		if k.Resources != nil {
			if err := k.Resources.validate(); err != nil {
				return err
			}
		}
		switch {
		case k.Pod != nil:
			return errors.New("pod needs runner: kubernetes")
		case k.StartTimeout != 0:
			return errors.New("start_timeout needs runner: kubernetes")
		case k.PodRetention != nil:
			return errors.New("pod_retention needs runner: kubernetes")
		}
		return nil
	case RunnerKubernetes:
	default:
		return fmt.Errorf("runner %q: want %q or %q", k.Runner, RunnerHost, RunnerKubernetes)
	}
	switch {
	case k.Function != "":
		return errors.New("runner kubernetes runs a command in the pod's image, not a function of this program")
	case k.User != "" || k.Group != "":
		return errors.New("runner kubernetes: the command runs as its container's user (the pod's securityContext), not user or group")
	case k.LockMode == LockModeHost:
		return errors.New("runner kubernetes: each pod holds its own lock, in lock_mode row or advisory, not host")
	case k.Resources != nil:
		return errors.New("runner kubernetes: a pod's limits are its template's (pod: spec.containers[].resources), not resources")
	case k.Pod == nil:
		return errors.New("runner kubernetes needs pod, the template of its pods, with a container named task")
	case k.StartTimeout < 0 || k.StartTimeout > Duration(24*time.Hour):
		return fmt.Errorf("start_timeout %s: want more than 0s, at most 24h", k.StartTimeout)
	case k.PodRetention == nil || *k.PodRetention < 0 || *k.PodRetention > MaxDelay:
		return fmt.Errorf("pod_retention: want 0s or more, at most %s", MaxDelay)
	}
	return nil
}

// validateFailures checks the retry, exit code, timeout and stall settings.
func (k *Kind) validateFailures() error {
	if p := k.Retry; p != nil {
		switch {
		case p.MaxAttempts < 0:
			return errors.New("retry.max_attempts must not be negative")
		case p.MaxAttempts != k.MaxAttempts:
			return fmt.Errorf("max_attempts %d and retry.max_attempts %d disagree: set one", k.MaxAttempts, p.MaxAttempts)
		case p.Delay < 0 || p.MaxDelay < 0:
			return errors.New("retry delays must not be negative")
		case p.Backoff != BackoffExponential && p.Backoff != BackoffFixed:
			return fmt.Errorf("retry.backoff %q: want %q or %q", p.Backoff, BackoffFixed, BackoffExponential)
		case p.Delay == 0:
			return errors.New("retry.delay must be set")
		case p.MaxDelay < p.Delay:
			return fmt.Errorf("retry.max_delay %s is shorter than retry.delay %s", p.MaxDelay, p.Delay)
		}
	}
	if len(k.RetryOnExitCodes) > 0 && len(k.FailOnExitCodes) > 0 {
		return errors.New("retry_on_exit_codes and fail_on_exit_codes exclude each other: set one")
	}
	for _, c := range slices.Concat(k.RetryOnExitCodes, k.FailOnExitCodes) {
		if c < 1 || c > 255 {
			return fmt.Errorf("exit code %d: want 1 to 255 (0 is success)", c)
		}
	}
	switch p := k.Retry; {
	case k.Timeout < 0:
		return errors.New("timeout must not be negative")
	case k.OnTimeout != OnTimeoutRetry && k.OnTimeout != OnTimeoutFail:
		return fmt.Errorf("on_timeout %q: want %q or %q", k.OnTimeout, OnTimeoutRetry, OnTimeoutFail)
	case k.KillGrace == nil || *k.KillGrace < 0:
		return errors.New("kill_grace must not be negative")
	case *k.KillGrace > MaxKillGrace:
		return fmt.Errorf("kill_grace %s: at most %s", *k.KillGrace, MaxKillGrace)
	case k.Timeout > MaxDelay:
		return fmt.Errorf("timeout %s: at most %s", k.Timeout, MaxDelay)
	case k.StallAfter != 0 && (k.StallAfter < Duration(time.Second) || k.StallAfter > MaxDelay):
		return fmt.Errorf("stall_after %s: want 0 (none), or from 1s to %s", k.StallAfter, MaxDelay)
	case k.OnStall != OnStallWarn && k.OnStall != OnStallKill:
		return fmt.Errorf("on_stall %q: want %q or %q", k.OnStall, OnStallWarn, OnStallKill)
	case k.OnStall == OnStallKill && k.StallAfter == 0:
		return errors.New("on_stall kill needs stall_after")
	case p != nil && (p.Delay > MaxDelay || p.MaxDelay > MaxDelay):
		return fmt.Errorf("retry delays: at most %s", MaxDelay)
	}
	return nil
}

// validateSchedule checks the schedule settings.
func (k *Kind) validateSchedule() error {
	if k.Schedule == "" {
		switch {
		case k.Timezone != "":
			return errors.New("timezone needs schedule")
		case k.Overlap != "":
			return errors.New("overlap needs schedule")
		case k.ScheduleArgs != nil:
			return errors.New("schedule_args needs schedule")
		}
		return nil
	}
	sched, err := k.ScheduleOf()
	if err != nil {
		return err
	}
	if sched.Next(time.Now()).IsZero() {
		return fmt.Errorf("schedule %q has no tick in the next five years", k.Schedule)
	}
	switch k.Overlap {
	case OverlapSkip, OverlapAllow:
	case OverlapQueue:
		if k.MaxRunning != 1 {
			return fmt.Errorf("overlap queue runs one task at a time, but max_running is %d", k.MaxRunning)
		}
	default:
		return fmt.Errorf("overlap %q: want %q, %q or %q", k.Overlap, OverlapSkip, OverlapQueue, OverlapAllow)
	}
	// Measured as the database gives them back, which is what the task
	// gets.
	if n := protocol.JSONBTextLen(k.ScheduleArgs); n > protocol.MaxEnvPayload {
		return fmt.Errorf("schedule_args are %d bytes (as stored); a task receives them in "+protocol.ArgsEnv+", which holds at most %d", n, protocol.MaxEnvPayload)
	}
	if err := k.CheckConcurrencyKey(json.RawMessage(k.ScheduleArgs)); err != nil {
		return fmt.Errorf("schedule_args: %w", err)
	}
	return nil
}
