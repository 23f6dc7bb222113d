package protocol

// Outcome is the payload of the event an attempt ends with (EventFinal,
// EventError or EventCancelled), as its task process records it. The
// database reads Retry; the page and `dama status` show the rest.
type Outcome struct {
	// Reason says, in a line, why the attempt ended other than DONE.
	Reason string `json:"reason,omitempty"`
	// ExitCode is the command's exit code (-1 for a death by a signal);
	// nil when no command ran to an end.
	ExitCode *int `json:"exit_code,omitempty"`
	// Exit says how the command ended when Reason is the failure the
	// command itself reported.
	Exit string `json:"exit,omitempty"`
	// LogTail is the end of the command's log, for a failed command.
	LogTail *string `json:"log_tail,omitempty"`
	// TimedOut says the command ran past its kind's timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Retry, false, makes the task FAILED whatever attempts remain: the
	// kind's policy, or the command, says this failure is not retried
	// (an exit code in fail_on_exit_codes, a timeout with on_timeout:
	// fail, "retry": false on its failure line). nil leaves it to the
	// attempts left.
	Retry *bool `json:"retry,omitempty"`
	// Children counts a parent's children by status, once it awaited
	// them.
	Children map[string]int `json:"children,omitzero"`
	// Usage is what the attempt's processes cost, from its control group;
	// nil where it had none.
	Usage *Usage `json:"usage,omitempty"`
	// DetailsLost says the database refused the outcome as written, and
	// this is its plain part.
	DetailsLost bool `json:"details_lost,omitempty"`
}

// Usage is what an attempt's processes cost, by the kernel's counters of
// its control group; data_manager.etl_attempts keeps it.
type Usage struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	PeakMemory  int64   `json:"peak_memory_bytes,omitempty"`
	ReadBytes   int64   `json:"io_read_bytes"`
	WriteBytes  int64   `json:"io_write_bytes"`
	MemoryLimit int64   `json:"memory_limit_bytes,omitempty"`
	// OOMKilled says the kernel killed a process of the attempt for its
	// memory limit.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// ForksRefused counts the forks its pids limit refused.
	ForksRefused int64 `json:"forks_refused,omitempty"`
}

// Final returns o marked as not to be retried (Retry false).
func (o Outcome) Final() Outcome {
	o.Retry = new(false)
	return o
}
