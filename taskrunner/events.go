package taskrunner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/dama-etl/dama/etlcontext"
)

// MaxEventLine is the longest line a command may write on its events pipe;
// a longer one is recorded as a WARNING event and skipped.
const MaxEventLine = 1 << 20

// MaxEnvPayload bounds the arguments and checkpoints handed to a command in
// DAMA_ARGS and DAMA_CHECKPOINT: Linux refuses to exec with an environment
// string over 128 KiB, which would make every retry fail. A larger checkpoint
// is recorded as a WARNING, and the previous checkpoint stands.
const MaxEnvPayload = 96 << 10

// reported is one line the command wrote on its events pipe, decoded.
type reported struct {
	suffix  string
	payload json.RawMessage
	meta    any
	isError bool
	// child, when set, is a child to submit (a "submit" line); it is
	// recorded as a SUBMITTED event.
	child *Child
	// failure, when set, is why the command is about to fail (a "failure"
	// line); it is recorded in the attempt's ERROR event, not as an event
	// of its own.
	failure *Failure
	// replaced is what was replaced in the line so that the database takes
	// it (see etlcontext.CleanJSON); a WARNING says so.
	replaced etlcontext.Replaced
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

// MaxIdempotencyKey bounds an idempotency key, a child's or a user's: the
// database indexes it.
const MaxIdempotencyKey = 512

// autoKeyPrefix starts the part of the key of a child submitted without
// one that names the line: dama:child:<parent>:auto:<run id>:<sequence
// number>. A command's own key cannot start with it, so as not to name
// another line's child.
const autoKeyPrefix = "auto:"

// MaxFailureError bounds the reason a failure line gives.
const MaxFailureError = 4 << 10

// Child is a task a command submits as its task's child, with a line
//
//	{"type": "submit", "payload": {"kind": "...", "args": {...}, "idempotency_key": "..."}}
//
// on its events pipe.
type Child struct {
	// ParentID is the submitting task's context.
	ParentID int64
	// Kind must be a kind of the runner's configuration.
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
	// "auto:".
	IdempotencyKey string `json:"idempotency_key"`
}

// The types of the lines that are directives to the runner rather than
// events: a child to submit, a failure to report.
const (
	submitType  = "SUBMIT"
	failureType = "FAILURE"
)

var suffixRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,62}$`)

// reservedSuffixes are written by dama alone: a task cannot declare itself
// done or forge its arguments.
var reservedSuffixes = map[string]bool{
	etlcontext.EventInitial:   true,
	etlcontext.EventFinal:     true,
	etlcontext.EventError:     true,
	etlcontext.EventCancelled: true,
	etlcontext.EventTimeout:   true,
	etlcontext.EventRetried:   true,
	etlcontext.EventSubmitted: true,
	etlcontext.EventAwaiting:  true,
	// Who asked to cancel is the asker's to say.
	etlcontext.EventCancelRequested: true,
}

// decodeLine turns one line of the events pipe into the event to store: the
// reported one, or a WARNING saying what was wrong with the line.
func decodeLine(line []byte) reported {
	// Cleaned first, so that what the line says (a payload, a failure's
	// reason, a child's arguments) is stored and not refused.
	clean, replaced, err := etlcontext.CleanJSON(line)
	if err != nil {
		// Not one JSON value; the decoder says more of why, but takes some
		// such lines (one with a stray '}' after the value) as good.
		if rep := decodeCleanLine(line); rep.suffix == etlcontext.EventWarning && rep.child == nil && rep.failure == nil {
			return rep
		}
		return warning("malformed event line: not one JSON value", line)
	}
	rep := decodeCleanLine(clean)
	if rep.child != nil && rep.child.IdempotencyKey != "" && replaced.Any() {
		// Keys that differ only in what was replaced would become one:
		// the child is not submitted under a key it was not given.
		return warning(fmt.Sprintf("submit: the line holds %s that the database cannot store; a child with an idempotency key is submitted only from a clean line", replaced), line)
	}
	rep.replaced = replaced
	return rep
}

func decodeCleanLine(line []byte) reported {
	var msg struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&msg); err != nil {
		return warning(fmt.Sprintf("malformed event line: %v", err), line)
	}
	if dec.More() {
		return warning("malformed event line: more than one JSON value", line)
	}
	suffix := strings.ToUpper(msg.Type)
	if !suffixRE.MatchString(suffix) {
		return warning(fmt.Sprintf("event type %q: want letters, digits and '_', starting with a letter", msg.Type), line)
	}
	if reservedSuffixes[suffix] {
		return warning(fmt.Sprintf("event type %q is reserved for dama", msg.Type), line)
	}
	payload := msg.Payload
	if len(payload) == 0 || string(payload) == "null" {
		payload = nil
	}
	switch suffix {
	case submitType:
		return decodeChild(payload, line)
	case failureType:
		return decodeFailure(payload, line)
	}
	// Measured as the database gives it back, which is what a retry gets.
	if n := etlcontext.JSONBTextLen(payload); suffix == etlcontext.EventCheckpoint && n > MaxEnvPayload {
		return warning(fmt.Sprintf("checkpoint of %d bytes (as stored) exceeds the %d bytes a retry receives in DAMA_CHECKPOINT; the previous checkpoint stands", n, MaxEnvPayload), line)
	}
	return reported{suffix: suffix, payload: payload}
}

func decodeChild(payload json.RawMessage, line []byte) reported {
	var c Child
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return warning(fmt.Sprintf(`submit: want {"kind": ..., "args": {...}, "idempotency_key": ...}: %v`, err), line)
	}
	if c.Kind == "" {
		return warning("submit: kind is required", line)
	}
	if n := etlcontext.JSONBTextLen(c.Args); n > MaxEnvPayload {
		return warning(fmt.Sprintf("submit: arguments of %d bytes (as stored) exceed the %d bytes a task receives in DAMA_ARGS", n, MaxEnvPayload), line)
	}
	if len(c.IdempotencyKey) > MaxIdempotencyKey {
		return warning(fmt.Sprintf("submit: idempotency key of %d bytes; at most %d", len(c.IdempotencyKey), MaxIdempotencyKey), line)
	}
	if strings.HasPrefix(c.IdempotencyKey, autoKeyPrefix) {
		return warning(fmt.Sprintf("submit: idempotency keys starting with %q are dama's own", autoKeyPrefix), line)
	}
	return reported{suffix: etlcontext.EventSubmitted, child: &c}
}

func decodeFailure(payload json.RawMessage, line []byte) reported {
	var f Failure
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return warning(fmt.Sprintf(`failure: want {"error": "...", "retry": true|false}: %v`, err), line)
	}
	if f.Error == "" {
		return warning("failure: error is required", line)
	}
	f.Error = truncateUTF8(f.Error, MaxFailureError)
	return reported{failure: &f}
}

// truncateUTF8 cuts s to at most n bytes, on a character boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func warning(problem string, line []byte) reported {
	const keep = 512
	excerpt := string(line)
	if len(excerpt) > keep {
		excerpt = excerpt[:keep]
	}
	return reported{
		suffix:  etlcontext.EventWarning,
		meta:    map[string]any{"problem": problem, "line": strings.ToValidUTF8(excerpt, "\uFFFD"), "line_bytes": len(line)},
		isError: false,
	}
}

// readEvents reads newline-delimited JSON from r until EOF and hands each
// decoded line to emit, which may block: the pipe is then not read, and
// the command blocks on its writes. Oversized lines are skipped up to their
// newline and reported; nothing the command writes can stop the reader.
func readEvents(r io.Reader, emit func(reported)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	oversized := 0
	for {
		chunk, err := br.ReadSlice('\n')
		complete := err == nil
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read events pipe: %w", err)
		}
		limit := MaxEventLine
		if complete {
			limit++ // the newline is not the line's
		}
		switch {
		case oversized > 0:
			oversized += len(chunk)
		case len(buf)+len(chunk) > limit:
			oversized = len(buf) + len(chunk)
			buf = buf[:0]
		default:
			buf = append(buf, chunk...)
		}
		if complete || (errors.Is(err, io.EOF) && (len(buf) > 0 || oversized > 0)) {
			if oversized > 0 {
				emit(reported{
					suffix: etlcontext.EventWarning,
					meta:   map[string]any{"problem": fmt.Sprintf("event line of %d bytes exceeds the limit of %d bytes", oversized, MaxEventLine), "line_bytes": oversized},
				})
			} else if line := bytes.TrimSpace(buf); len(line) > 0 {
				emit(decodeLine(line))
			}
			// A long line's buffer is not kept for the short ones after it.
			if cap(buf) > 64<<10 {
				buf = nil
			}
			buf = buf[:0]
			oversized = 0
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}
