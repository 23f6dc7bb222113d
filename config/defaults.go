package config

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// Defaults applied to the fields left unset (see each field's comment).
const (
	DefaultPollInterval      = Duration(5 * time.Second)
	DefaultHeartbeatInterval = Duration(5 * time.Second)
	DefaultKillGrace         = Duration(10 * time.Second)
	DefaultReconnectGrace    = Duration(2 * time.Minute)
	DefaultProgressInterval  = Duration(10 * time.Second)
	DefaultLogTailBytes      = 1 << 20
	DefaultLogTailInterval   = Duration(5 * time.Second)
	DefaultRetention         = Duration(30 * 24 * time.Hour)
	DefaultMaxAttempts       = 3
	DefaultMaxRunning        = 10
	DefaultMaxRunningPerKey  = 1
	DefaultQueue             = "default"
	DefaultLockMode          = LockModeRow
	DefaultRetryDelay        = Duration(time.Minute)
	DefaultRetryMaxDelay     = Duration(time.Hour)
	DefaultStartTimeout      = Duration(5 * time.Minute)
)

// WithDefaults returns a copy of c with every field left unset given its
// default, as each field's comment says: the one place defaults are
// applied, so that a hand-built Config behaves like a parsed one. Parse
// applies it; supervisor.New and dama.NewClient apply it to the
// Config they are given. Values that are set are left as they are, wrong
// ones too: Validate tells those.
func (c *Config) WithDefaults() *Config {
	out := *c
	if out.PollInterval == 0 {
		out.PollInterval = DefaultPollInterval
	}
	if out.HeartbeatInterval == 0 {
		out.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if out.KillGrace == 0 {
		out.KillGrace = DefaultKillGrace
	}
	if out.ReconnectGrace == nil {
		out.ReconnectGrace = ptr(DefaultReconnectGrace)
	} else {
		out.ReconnectGrace = ptr(*out.ReconnectGrace)
	}
	if out.Retention == 0 {
		out.Retention = DefaultRetention
	}
	if out.ProgressInterval == 0 {
		out.ProgressInterval = DefaultProgressInterval
	}
	if out.LogTailBytes == 0 {
		out.LogTailBytes = DefaultLogTailBytes
	}
	if out.LogTailInterval == 0 {
		out.LogTailInterval = DefaultLogTailInterval
	}
	if out.LockMode == "" {
		out.LockMode = DefaultLockMode
	}
	out.Queues = maps.Clone(out.Queues)
	if out.Queues == nil {
		out.Queues = map[string]Queue{}
	}
	for name, q := range out.Queues {
		if q.MaxRunning == 0 {
			q.MaxRunning = DefaultMaxRunning
		}
		out.Queues[name] = q
	}
	out.Kinds = maps.Clone(out.Kinds)
	for name, k := range out.Kinds {
		out.Kinds[name] = out.kindDefaults(k)
	}
	return &out
}

// kindDefaults is k with its defaults, some of which come from c (already
// given its own).
func (c *Config) kindDefaults(k Kind) Kind {
	k.Command = slices.Clone(k.Command)
	k.RetryOnExitCodes = slices.Clone(k.RetryOnExitCodes)
	k.FailOnExitCodes = slices.Clone(k.FailOnExitCodes)
	k.PassEnv = slices.Clone(k.PassEnv)
	if k.Queue == "" {
		k.Queue = DefaultQueue
	}
	if _, ok := c.Queues[k.Queue]; !ok && k.Queue == DefaultQueue {
		// The default queue need not be configured, whether a kind names
		// it or not.
		c.Queues[DefaultQueue] = Queue{MaxRunning: DefaultMaxRunning}
	}
	if k.MaxAttempts == 0 && k.Retry != nil && k.Retry.MaxAttempts > 0 {
		k.MaxAttempts = k.Retry.MaxAttempts
	}
	if k.MaxAttempts == 0 {
		k.MaxAttempts = DefaultMaxAttempts
	}
	if k.Retry != nil {
		p := *k.Retry
		if p.MaxAttempts == 0 {
			p.MaxAttempts = k.MaxAttempts
		}
		if p.Backoff == "" {
			p.Backoff = BackoffExponential
		}
		if p.Delay == 0 {
			p.Delay = DefaultRetryDelay
		}
		if p.MaxDelay == 0 {
			p.MaxDelay = max(DefaultRetryMaxDelay, p.Delay)
		}
		k.Retry = &p
	}
	if k.OnTimeout == "" {
		k.OnTimeout = OnTimeoutRetry
	}
	if k.KillGrace == nil {
		k.KillGrace = ptr(c.KillGrace)
	} else {
		k.KillGrace = ptr(*k.KillGrace)
	}
	if k.SessionFence == nil {
		k.SessionFence = ptr(true)
	} else {
		k.SessionFence = ptr(*k.SessionFence)
	}
	if k.Runner == "" {
		k.Runner = RunnerHost
	}
	if k.LockMode == "" {
		k.LockMode = c.LockMode
		if k.Runner == RunnerKubernetes && k.LockMode == LockModeHost {
			// A pod holds its own lock: host's keeper is a host's.
			k.LockMode = DefaultLockMode
		}
	}
	if k.User == "" && k.Runner == RunnerHost {
		// A pod's command runs as its container's user.
		k.User, k.Group = c.User, cmp.Or(k.Group, c.Group)
	}
	if k.Runner == RunnerKubernetes {
		if k.StartTimeout == 0 {
			k.StartTimeout = DefaultStartTimeout
		}
		if k.PodRetention == nil {
			k.PodRetention = ptr(c.Retention)
		} else {
			k.PodRetention = ptr(*k.PodRetention)
		}
		k.Pod = slices.Clone(k.Pod)
	}
	if k.ConcurrencyKey != "" && k.MaxRunningPerKey == 0 {
		k.MaxRunningPerKey = DefaultMaxRunningPerKey
	}
	if k.Schedule != "" {
		if k.Overlap == "" {
			k.Overlap = OverlapSkip
		}
		if k.Overlap == OverlapQueue && k.MaxRunning == 0 {
			k.MaxRunning = 1
		}
		if k.ScheduleArgs == nil {
			k.ScheduleArgs = JSONObject("{}")
		} else {
			k.ScheduleArgs = slices.Clone(k.ScheduleArgs)
		}
	}
	return k
}

func ptr[T any](v T) *T { return &v }

// Upper bounds of the durations, which Validate enforces: a task process
// adds its heartbeat's silence bound, reconnect_grace and kill_grace into
// its fencing window, and the kernel takes the heartbeat in whole seconds
// and milliseconds of 32 bits, so that none of these overflows.
const (
	MaxPollInterval      = Duration(time.Hour)
	MaxHeartbeatInterval = Duration(time.Hour)
	MaxReconnectGrace    = Duration(7 * 24 * time.Hour)
	MaxKillGrace         = Duration(24 * time.Hour)
	// MaxProgressInterval bounds progress_interval: a sample of progress
	// at least every hour.
	MaxProgressInterval = Duration(time.Hour)
	// MaxLogTailInterval bounds log_tail_interval: the database's tail
	// at most an hour behind.
	MaxLogTailInterval = Duration(time.Hour)
	// MaxLogTailBytes bounds log_tail_bytes: what each attempt may keep
	// in the database, and what one write of it may carry.
	MaxLogTailBytes = 64 << 20
	// MaxDelay bounds a kind's timeout and its retry delays.
	MaxDelay = Duration(10 * 365 * 24 * time.Hour)
)
