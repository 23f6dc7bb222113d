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
	"github.com/dama-etl/dama/protocol"
)

// reported is one line the command wrote on its events pipe, decoded.
type reported struct {
	suffix  string
	payload json.RawMessage
	meta    any
	isError bool
	// child, when set, is a child to submit (a "submit" line), recorded as
	// a SUBMITTED event.
	child *protocol.Child
	// failure, when set, is why the command is about to fail (a "failure"
	// line), recorded in the attempt's ERROR event.
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
	var rep reported
	if typ, payload, ok := plainLine(clean); ok {
		rep = decodeFields(typ, payload, clean)
	} else {
		rep = decodeCleanLine(clean)
	}
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
	dec := strictDecoder(line)
	if err := dec.Decode(&msg); err != nil {
		return warning(fmt.Sprintf("malformed event line: %v", err), line)
	}
	if dec.More() {
		return warning("malformed event line: more than one JSON value", line)
	}
	return decodeFields(msg.Type, msg.Payload, line)
}

func strictDecoder(data []byte) *json.Decoder {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec
}

// decodeFields decodes a line's type and payload.
func decodeFields(typ string, payload json.RawMessage, line []byte) reported {
	suffix := strings.ToUpper(typ)
	if !protocol.ValidSuffix(suffix) {
		return warning(fmt.Sprintf("event type %q: want letters, digits and '_', starting with a letter", typ), line)
	}
	if protocol.Reserved(suffix) {
		return warning(fmt.Sprintf("event type %q is reserved for dama", typ), line)
	}
	if len(payload) == 0 || string(payload) == "null" {
		payload = nil
	}
	switch suffix {
	case protocol.TypeSubmit:
		return decodeChild(payload, line)
	case protocol.TypeFailure:
		return decodeFailure(payload, line)
	case protocol.EventCheckpoint:
		// Measured as the database gives it back, which is what a retry gets.
		if err := protocol.CheckCheckpoint(payload); err != nil {
			return warning(err.Error()+"; the previous checkpoint stands", line)
		}
	}
	return reported{suffix: suffix, payload: payload}
}

func decodeChild(payload json.RawMessage, line []byte) reported {
	var c protocol.Child
	if err := strictDecoder(payload).Decode(&c); err != nil {
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
	if err := strictDecoder(payload).Decode(&f); err != nil {
		return warning(fmt.Sprintf(`failure: want {"error": "...", "retry": true|false}: %v`, err), line)
	}
	if f.Error == "" {
		return warning("failure: error is required", line)
	}
	f.Error = protocol.TruncateUTF8(f.Error, protocol.MaxFailureError)
	return reported{failure: &f}
}

func warning(problem string, line []byte) reported {
	excerpt := string(line[:min(len(line), 512)])
	return reported{
		suffix: protocol.EventWarning,
		meta:   map[string]any{"problem": problem, "line": strings.ToValidUTF8(excerpt, "\uFFFD"), "line_bytes": len(line)},
	}
}

// readEvents hands each line of r, decoded, to emit, which may block (the
// command then blocks on its writes). Oversized lines are skipped up to
// their newline and reported: nothing the command writes stops the reader.
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

// plainLine reads line, one valid JSON value (what etlcontext.CleanJSON
// returns; other bytes go to the decoder, or may read wrong), when it is
// the common line: an object of "type", a string of ASCII letters, digits
// and '_', and optionally "payload", each once, spelled so. It returns what
// decodeCleanLine's decoder would, without the decoder's reflection, whose
// code would stay in the resident set of a runner relaying many lines a
// second; ok false leaves the line to the decoder.
func plainLine(line []byte) (typ string, payload json.RawMessage, ok bool) {
	i := skipSpace(line, 0)
	if i == len(line) || line[i] != '{' {
		return "", nil, false
	}
	i = skipSpace(line, i+1)
	seenType, seenPayload := false, false
	for i < len(line) && line[i] == '"' {
		keyEnd := stringEnd(line, i)
		if keyEnd-1 <= i || line[keyEnd-1] != '"' {
			// Not valid JSON after all: the decoder says why.
			return "", nil, false
		}
		key := line[i+1 : keyEnd-1]
		i = skipSpace(line, keyEnd)
		if i == len(line) || line[i] != ':' {
			return "", nil, false
		}
		i = skipSpace(line, i+1)
		end := valueEnd(line, i)
		switch {
		case string(key) == "type" && !seenType:
			v := line[i:end]
			if len(v) < 2 || v[0] != '"' {
				return "", nil, false
			}
			for _, c := range v[1 : len(v)-1] {
				if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
					return "", nil, false
				}
			}
			typ, seenType = string(v[1:len(v)-1]), true
		case string(key) == "payload" && !seenPayload:
			// A copy, as the decoder's: the line's buffer is read into again.
			payload, seenPayload = append(json.RawMessage(nil), line[i:end]...), true
		default:
			return "", nil, false
		}
		i = skipSpace(line, end)
		if i < len(line) && line[i] == ',' {
			i = skipSpace(line, i+1)
			continue
		}
		break
	}
	if !seenType || i == len(line) || line[i] != '}' || skipSpace(line, i+1) != len(line) {
		return "", nil, false
	}
	return typ, payload, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the end of the JSON string starting at b[i]; b is valid JSON.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return min(i+1, len(b))
}

// valueEnd returns the end of the JSON value starting at b[i]; b is valid JSON.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(b) && !strings.ContainsRune(",}] \t\n\r", rune(b[i])) {
		i++
	}
	return i
}
