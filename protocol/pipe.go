package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A command reports on its events pipe (EventsFD), one JSON object per
// line:
//
//	{"type": "progress", "payload": {"step": 3, "of": 10}}
//
// Each line is stored as an event of type <kind>:<TYPE upper-cased>
// (EventType), but for the directives "submit" and "failure" (Child,
// Failure) and the types dama writes itself (Reserved).
type Line struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// MaxEventLine is the longest line a command may write on its events pipe;
// a longer one is recorded as a WARNING event and skipped.
const MaxEventLine = 1 << 20

// MaxEnvPayload bounds the arguments and checkpoints handed to a command in
// ArgsEnv and CheckpointEnv: Linux refuses to exec with an environment
// string over 128 KiB, which would make every retry fail. A larger checkpoint
// is recorded as a WARNING, and the previous checkpoint stands.
const MaxEnvPayload = 96 << 10

// MaxIdempotencyKey bounds an idempotency key, a child's or a user's: the
// database indexes it.
const MaxIdempotencyKey = 512

// MaxFailureError bounds the reason a failure line gives.
const MaxFailureError = 4 << 10

// The event suffixes with a meaning to dama: a stored event's type is
// <kind>:<suffix> (EventType). A task may report any other upper-case
// suffix (ValidSuffix) but those dama writes itself (Reserved).
const (
	EventInitial    = "INITIAL"
	EventFinal      = "FINAL"
	EventError      = "ERROR"
	EventCancelled  = "CANCELLED"
	EventProgress   = "PROGRESS"
	EventCheckpoint = "CHECKPOINT"
	EventWarning    = "WARNING"
	// EventTimeout records that an attempt's command outran its kind's
	// timeout and was stopped; the attempt's ERROR follows.
	EventTimeout = "TIMEOUT"
	// EventStalled marks a running task stalled: its command reported
	// nothing, on its events pipe or in its log, for its kind's
	// stall_after. The mark holds while it is the task's latest event;
	// with on_stall kill the command is stopped, as for a timeout.
	EventStalled = "STALLED"
	// EventUnstalled clears the mark: the command reported again.
	EventUnstalled = "UNSTALLED"
	// EventRetried reopens a FAILED or CANCELLED context for a new attempt
	// (`dama retry`): the one event a finished context accepts.
	EventRetried = "RETRIED"
	// EventSubmitted records a child submitted by the task's command on its
	// events pipe, in the transaction that creates the child: only the
	// current attempt can submit one.
	EventSubmitted = "SUBMITTED"
	// EventCancelRequested records who asked a running task to stop; the
	// task process records its CANCELLED once it has.
	EventCancelRequested = "CANCEL_REQUESTED"
	// EventAwaiting records that the command of a kind with await_children
	// succeeded and the task now waits for its children to finish.
	EventAwaiting = "AWAITING"
)

// The types of the lines that are directives to the task process rather
// than events: a child to submit (Child), a failure to report (Failure).
const (
	TypeSubmit  = "SUBMIT"
	TypeFailure = "FAILURE"
)

// EventType is the type of an event of a task of kind: "<kind>:<suffix>".
func EventType(kind, suffix string) string { return kind + ":" + suffix }

// EventSuffix is the suffix of an event type ("" for a type with none).
func EventSuffix(eventType string) string {
	_, suffix, _ := strings.Cut(eventType, ":")
	return suffix
}

// ValidSuffix reports whether suffix may be an event's suffix: an
// upper-case letter, then upper-case letters, digits and '_', at most 63.
// (A loop, not a regular expression: a runner checks every line its
// command reports, and the regexp engine's code would stay in its
// resident set.)
func ValidSuffix(suffix string) bool {
	if len(suffix) == 0 || len(suffix) > 63 || suffix[0] < 'A' || suffix[0] > 'Z' {
		return false
	}
	for i := 1; i < len(suffix); i++ {
		switch c := suffix[i]; {
		case 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_':
		default:
			return false
		}
	}
	return true
}

// Reserved reports whether suffix is written by dama alone: a task cannot
// declare itself done, forge its arguments or say who cancelled it.
func Reserved(suffix string) bool {
	switch suffix {
	case EventInitial, EventFinal, EventError, EventCancelled, EventTimeout,
		EventRetried, EventSubmitted, EventAwaiting, EventCancelRequested,
		EventStalled, EventUnstalled:
		return true
	}
	return false
}

// Failure is why a command is about to fail, which it may say with a line
//
//	{"type": "failure", "payload": {"error": "...", "retry": false}}
//
// on its events pipe before it exits. When the command then exits non-zero
// (and was not stopped by dama), the attempt's ERROR event gives Error as
// its reason, and Retry false fails the task for good whatever attempts
// remain. The last such line counts; a command that exits 0 is DONE
// whatever it said.
type Failure struct {
	// Error says what went wrong; it is cut to MaxFailureError bytes.
	Error string `json:"error"`
	// Retry, when false, says not to try again; default true.
	Retry *bool `json:"retry"`
}

// Child is a task a command submits as its task's child, with a line
//
//	{"type": "submit", "payload": {"kind": "...", "args": {...}, "idempotency_key": "..."}}
//
// on its events pipe.
type Child struct {
	// ParentID is the submitting task's context: the task process sets it,
	// whatever the line says (a line may carry it, as dama's earlier
	// releases wrote it).
	ParentID int64 `json:",omitempty"`
	// Kind must be a kind of the task process's configuration.
	Kind string `json:"kind"`
	// Args are the child's arguments; empty means {}.
	Args json.RawMessage `json:"args"`
	// IdempotencyKey, when the command gives one, makes the submission
	// return the parent's earlier child with the same key (a later attempt
	// of the parent submitting it again, say). The key is stored scoped to
	// the parent: dama:child:<parent id>:<key>. Without one, the key is
	// dama:child:<parent id>:auto:<run id>:<line's sequence number>, so
	// that a write retried after a lost connection submits one child. A
	// key is at most MaxIdempotencyKey bytes and does not start with
	// AutoKeyPrefix.
	IdempotencyKey string `json:"idempotency_key"`
}

// AutoKeyPrefix starts the part of the key of a child submitted without
// one that names the line: dama:child:<parent>:auto:<run id>:<sequence
// number>. A command's own key cannot start with it, so as not to name
// another line's child.
const AutoKeyPrefix = "auto:"

// TruncateUTF8 cuts s to at most n bytes without splitting a character:
// how a text over one of the limits above (a failure's reason) is cut.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CheckCheckpoint says what is wrong with a checkpoint's payload, if
// anything: measured as the database gives it back (jsonb adds spaces and
// prints numbers in full), which is what a retry receives in
// CheckpointEnv, it may be at most MaxEnvPayload bytes. The task process
// keeps the previous checkpoint instead (and records a WARNING); package
// task refuses to write it.
func CheckCheckpoint(payload json.RawMessage) error {
	if n := JSONBTextLen(payload); n > MaxEnvPayload {
		return fmt.Errorf("checkpoint of %d bytes (as stored) exceeds the %d bytes a retry receives in %s", n, MaxEnvPayload, CheckpointEnv)
	}
	return nil
}

// CheckArgs refuses a task's arguments, valid JSON, that are not an
// object: a task reads them as one (ArgsEnv), and a kind's concurrency
// key names one of their fields.
func CheckArgs(args json.RawMessage) error {
	trimmed := bytes.TrimLeft(args, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return nil
	}
	what := "nothing"
	if len(trimmed) > 0 {
		what = "a number"
		switch trimmed[0] {
		case '[':
			what = "an array"
		case '"':
			what = "a string"
		case 't', 'f':
			what = "a boolean"
		case 'n':
			what = "null"
		}
	}
	return fmt.Errorf("arguments must be a JSON object, not %s", what)
}

// Check says what is wrong with c, a child a submit line asks for, if
// anything: the task process refuses such a line (and records a WARNING),
// and package task refuses to write it. (A key holding bytes the database
// cannot store is the task process's to judge, on the line as written: a
// program's JSON encoder replaces them before it sees them.)
func (c Child) Check() error {
	if len(c.Args) > 0 && string(c.Args) != "null" {
		if err := CheckArgs(c.Args); err != nil {
			return err
		}
	}
	switch k := c.IdempotencyKey; {
	case c.Kind == "":
		return errors.New("kind is required")
	case JSONBTextLen(c.Args) > MaxEnvPayload:
		return fmt.Errorf("arguments of %d bytes (as stored) exceed the %d bytes a task receives in %s", JSONBTextLen(c.Args), MaxEnvPayload, ArgsEnv)
	case len(k) > MaxIdempotencyKey:
		return fmt.Errorf("idempotency key of %d bytes; at most %d", len(k), MaxIdempotencyKey)
	case strings.HasPrefix(k, AutoKeyPrefix):
		return fmt.Errorf("idempotency keys starting with %q are dama's own", AutoKeyPrefix)
	}
	return nil
}
