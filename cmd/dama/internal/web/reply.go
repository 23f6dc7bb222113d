package web

import (
	"bytes"
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
	if b.code == 0 {
		b.code = http.StatusOK
	}
	w.Header().Set("Content-Length", strconv.Itoa(b.body.Len()))
	w.WriteHeader(b.code)
	_, _ = w.Write(b.body.Bytes())
}

// writeJSON writes v. Served as application/json with nosniff, it needs no
// HTML escaping, which would make '<' six bytes.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// readError answers a failed read: a request it cannot read is 400, a
// missing task 404, anything else (the database away, a timeout) 503,
// which the page shows and retries.
func readError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, etlcontext.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	default:
		writeError(w, http.StatusServiceUnavailable, err)
	}
}

// actionError answers a failed action: 400 for a request it cannot read,
// 404 for what does not exist, 503 when the database could not be asked,
// and 409 when it refused (a task already finished, running, ...).
func actionError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, etlcontext.ErrNotFound), errors.Is(err, dama.ErrUnknownQueue):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, context.DeadlineExceeded), etlcontext.Unreachable(err), isConnectError(err):
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeError(w, http.StatusConflict, err)
	}
}

// isConnectError reports a connection the server refused (a login, say):
// the action never ran.
func isConnectError(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}
