package web

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/etlcontext"
)

// bufferedReply is a reply made in memory, to write later.
type bufferedReply struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedReply) Header() http.Header { return b.header }

func (b *bufferedReply) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedReply) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

// writeTo writes the reply to w, whose header it shares.
func (b *bufferedReply) writeTo(w http.ResponseWriter) {
	w.Header().Set("Content-Length", strconv.Itoa(b.body.Len()))
	w.WriteHeader(cmp.Or(b.code, http.StatusOK))
	_, _ = w.Write(b.body.Bytes())
}

// read serves a read: what h returns, as JSON, or its error (readError).
func (s *Server) read(h func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := h(r)
		if err != nil {
			readError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// writeJSON writes v, as it is when it is JSON already (json.RawMessage).
// Served as application/json with nosniff, it needs no HTML escaping,
// which would make '<' six bytes.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, isJSON := v.(json.RawMessage)
	if !isJSON {
		b, _ = marshal(v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// marshal is json.Marshal without HTML escaping, as writeJSON writes.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return b.Bytes(), err
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// internalError is a failure of the server's own (reading a file): a 500.
type internalError struct{ error }

// readError answers a failed read: 400 for a request it cannot read, 404
// for a missing task, 500 for the server's own failure, else (the database
// away, a timeout) 503, which the page shows and retries.
func readError(w http.ResponseWriter, err error) {
	_, internal := errors.AsType[internalError](err)
	switch {
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, etlcontext.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case internal:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeError(w, http.StatusServiceUnavailable, err)
	}
}

// actionError answers a failed action: 400 for a request it cannot read,
// 404 for what does not exist, 503 when the database could not be asked
// (a connection it refused, a login say, included: the action never ran),
// and 409 when it refused (a task already finished, running, ...).
func actionError(w http.ResponseWriter, err error) {
	_, refused := errors.AsType[*pgconn.ConnectError](err)
	switch {
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, etlcontext.ErrNotFound), errors.Is(err, dama.ErrUnknownQueue):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, context.DeadlineExceeded), etlcontext.Unreachable(err), refused:
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeError(w, http.StatusConflict, err)
	}
}
