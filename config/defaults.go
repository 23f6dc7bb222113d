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
// default, the one place defaults are applied, so that a hand-built Config
// behaves like a parsed one. Values that are set are left as they are,
// wrong ones too: Validate tells those.
func (c *Config) WithDefaults() *Config {
	out := *c
	out.PollInterval = cmp.Or(out.PollInterval, DefaultPollInterval)
	out.HeartbeatInterval = cmp.Or(out.HeartbeatInterval, DefaultHeartbeatInterval)
	out.KillGrace = cmp.Or(out.KillGrace, DefaultKillGrace)
	out.ReconnectGrace = copyOr(out.ReconnectGrace, DefaultReconnectGrace)
	out.Retention = cmp.Or(out.Retention, DefaultRetention)
	out.ProgressInterval = cmp.Or(out.ProgressInterval, DefaultProgressInterval)
	out.LogTailBytes = cmp.Or(out.LogTailBytes, DefaultLogTailBytes)
	out.LogTailInterval = cmp.Or(out.LogTailInterval, DefaultLogTailInterval)
	out.LockMode = cmp.Or(out.LockMode, DefaultLockMode)
	out.Queues = maps.Clone(out.Queues)
	if out.Queues == nil {
		out.Queues = map[string]Queue{}
	}
	for name, q := range out.Queues {
		q.MaxRunning = cmp.Or(q.MaxRunning, DefaultMaxRunning)
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
	k.Queue = cmp.Or(k.Queue, DefaultQueue)
	if _, ok := c.Queues[k.Queue]; !ok && k.Queue == DefaultQueue {
		// The default queue need not be configured, whether a kind names
		// it or not.
		c.Queues[DefaultQueue] = Queue{MaxRunning: DefaultMaxRunning}
	}
	if k.Retry != nil {
		k.MaxAttempts = cmp.Or(k.MaxAttempts, max(k.Retry.MaxAttempts, 0))
	}
	k.MaxAttempts = cmp.Or(k.MaxAttempts, DefaultMaxAttempts)
	if k.Retry != nil {
		p := *k.Retry
		p.MaxAttempts = cmp.Or(p.MaxAttempts, k.MaxAttempts)
		p.Backoff = cmp.Or(p.Backoff, BackoffExponential)
		p.Delay = cmp.Or(p.Delay, DefaultRetryDelay)
		p.MaxDelay = cmp.Or(p.MaxDelay, max(DefaultRetryMaxDelay, p.Delay))
		k.Retry = &p
	}
	k.OnTimeout = cmp.Or(k.OnTimeout, OnTimeoutRetry)
	k.OnStall = cmp.Or(k.OnStall, OnStallWarn)
	k.KillGrace = copyOr(k.KillGrace, c.KillGrace)
	k.SessionFence = copyOr(k.SessionFence, true)
	k.Runner = cmp.Or(k.Runner, RunnerHost)
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
	if k.Resources == nil && k.Runner == RunnerHost && c.Resources != nil {
		k.Resources = new(*c.Resources)
	}
	if k.Runner == RunnerKubernetes {
		k.StartTimeout = cmp.Or(k.StartTimeout, DefaultStartTimeout)
		k.PodRetention = copyOr(k.PodRetention, c.Retention)
		k.Pod = slices.Clone(k.Pod)
	}
	if k.ConcurrencyKey != "" {
		k.MaxRunningPerKey = cmp.Or(k.MaxRunningPerKey, DefaultMaxRunningPerKey)
	}
	if k.Schedule != "" {
		k.Overlap = cmp.Or(k.Overlap, OverlapSkip)
		if k.Overlap == OverlapQueue && k.MaxRunning == 0 {
			k.MaxRunning = 1
		}
		k.ScheduleArgs = slices.Clone(k.ScheduleArgs)
		if k.ScheduleArgs == nil {
			k.ScheduleArgs = JSONObject("{}")
		}
	}
	return k
}

// copyOr returns a copy of *p, or of def when p is nil: a copy shares
// nothing with the Config it came from.
func copyOr[T any](p *T, def T) *T {
	if p != nil {
		def = *p
	}
	return &def
}

// Upper bounds, which Validate enforces: a task process adds its
// heartbeat's silence bound, reconnect_grace and kill_grace into its
// fencing window, and the kernel takes the heartbeat in whole seconds and
// milliseconds of 32 bits, so that none of these may overflow.
const (
	MaxPollInterval      = Duration(time.Hour)
	MaxHeartbeatInterval = Duration(time.Hour)
	MaxReconnectGrace    = Duration(7 * 24 * time.Hour)
	MaxKillGrace         = Duration(24 * time.Hour)
	MaxProgressInterval  = Duration(time.Hour)
	MaxLogTailInterval   = Duration(time.Hour)
	// MaxLogTailBytes bounds log_tail_bytes: what each attempt may keep
	// in the database, and what one write of it may carry.
	MaxLogTailBytes = 64 << 20
	// MaxDelay bounds a kind's timeout and its retry delays.
	MaxDelay = Duration(10 * 365 * 24 * time.Hour)
)
