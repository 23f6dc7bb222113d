package taskrunner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// reported is one line the command wrote on its events pipe, decoded.
type reported struct {
	suffix  string
	payload json.RawMessage
	meta    any
	isError bool
	// child, when set, is a child to submit (a "submit" line); it is
	// recorded as a SUBMITTED event.
	child *protocol.Child
	// failure, when set, is why the command is about to fail (a "failure"
	// line); it is recorded in the attempt's ERROR event, not as an event
	// of its own.
	failure *protocol.Failure
	// replaced is what was replaced in the line so that the database takes
	// it (see etlcontext.CleanJSON); a WARNING says so.
	replaced etlcontext.Replaced
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
		if rep := decodeCleanLine(line); rep.suffix == protocol.EventWarning && rep.child == nil && rep.failure == nil {
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
	if !protocol.ValidSuffix(suffix) {
		return warning(fmt.Sprintf("event type %q: want letters, digits and '_', starting with a letter", msg.Type), line)
	}
	if protocol.Reserved(suffix) {
		return warning(fmt.Sprintf("event type %q is reserved for dama", msg.Type), line)
	}
	payload := msg.Payload
	if len(payload) == 0 || string(payload) == "null" {
		payload = nil
	}
	switch suffix {
	case protocol.TypeSubmit:
		return decodeChild(payload, line)
	case protocol.TypeFailure:
		return decodeFailure(payload, line)
	}
	// Measured as the database gives it back, which is what a retry gets.
	if suffix == protocol.EventCheckpoint {
		if err := protocol.CheckCheckpoint(payload); err != nil {
			return warning(err.Error()+"; the previous checkpoint stands", line)
		}
	}
	return reported{suffix: suffix, payload: payload}
}

func decodeChild(payload json.RawMessage, line []byte) reported {
	var c protocol.Child
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return warning(fmt.Sprintf(`submit: want {"kind": ..., "args": {...}, "idempotency_key": ...}: %v`, err), line)
	}
	if err := c.Check(); err != nil {
		return warning("submit: "+err.Error(), line)
	}
	if len(c.Args) == 0 || string(c.Args) == "null" {
		c.Args = json.RawMessage("{}")
	}
	return reported{suffix: protocol.EventSubmitted, child: &c}
}

func decodeFailure(payload json.RawMessage, line []byte) reported {
	var f protocol.Failure
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return warning(fmt.Sprintf(`failure: want {"error": "...", "retry": true|false}: %v`, err), line)
	}
	if f.Error == "" {
		return warning("failure: error is required", line)
	}
	f.Error = protocol.TruncateUTF8(f.Error, protocol.MaxFailureError)
	return reported{failure: &f}
}

func warning(problem string, line []byte) reported {
	const keep = 512
	excerpt := string(line)
	if len(excerpt) > keep {
		excerpt = excerpt[:keep]
	}
	return reported{
		suffix:  protocol.EventWarning,
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
		limit := protocol.MaxEventLine
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
					suffix: protocol.EventWarning,
					meta:   map[string]any{"problem": fmt.Sprintf("event line of %d bytes exceeds the limit of %d bytes", oversized, protocol.MaxEventLine), "line_bytes": oversized},
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
