// Package web serves dama's status page (`dama web`): the tasks, a task's
// events, attempts and log, the queues, and the operator's actions, over
// the same database as the supervisors. It reads the views; it never
// blocks a task.
//
// WORK IN PROGRESS (branch web-wip, issue 9): read-only pages and the JSON
// API. Actions, the actor recorded with them, and the browser test remain.
package web

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/supervisor"
)

//go:embed assets
var assets embed.FS

// TokenHeader carries the action token (DAMA_WEB_TOKEN) from the page's
// script: a header a cross-site form cannot send, and a cross-site script
// cannot either without a CORS preflight, which the server never grants.
const TokenHeader = "X-Dama-Token"

// Options configure a Server.
type Options struct {
	// Token allows actions when a request carries it in TokenHeader; empty
	// with ReadOnly false is refused by New.
	Token string
	// ReadOnly turns every action off.
	ReadOnly bool
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Server is the status page's HTTP handler.
type Server struct {
	pool   *pgxpool.Pool
	client *supervisor.Client
	opts   Options
	hostID string
	mux    *http.ServeMux
}

// New returns the page's handler over pool, with cfg's kinds and queues.
func New(pool *pgxpool.Pool, cfg *config.Config, opts Options) (*Server, error) {
	if opts.Token == "" && !opts.ReadOnly {
		return nil, errors.New("actions need a token: set DAMA_WEB_TOKEN, or serve the page read-only")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	client, err := supervisor.NewClient(pool, cfg)
	if err != nil {
		return nil, err
	}
	hostID, err := hostproc.ID()
	if err != nil {
		return nil, err
	}
	s := &Server{pool: pool, client: client, opts: opts, hostID: hostID, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	for path, page := range map[string]string{"GET /{$}": "index.html", "GET /tasks/{id}": "task.html", "GET /queues": "queues.html"} {
		s.mux.HandleFunc(path, s.page(page))
	}
	s.mux.HandleFunc("GET /api/tasks", s.tasks)
	s.mux.HandleFunc("GET /api/tasks/{id}", s.task)
	s.mux.HandleFunc("GET /api/tasks/{id}/log", s.log)
	s.mux.HandleFunc("GET /api/queues", s.queues)
	s.mux.HandleFunc("POST /api/tasks/{id}/cancel", s.action(s.cancel))
	s.mux.HandleFunc("POST /api/tasks/{id}/retry", s.action(s.retry))
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'")
	s.mux.ServeHTTP(w, r)
}

func (s *Server) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(b)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// taskJSON is a task with its progress read as a bar.
type taskJSON struct {
	etlcontext.Task
	Bar *etlcontext.Progress `json:"bar"`
}

func withBar(t etlcontext.Task) taskJSON {
	j := taskJSON{Task: t}
	if p, ok := etlcontext.ParseProgress(t.Progress); ok {
		j.Bar = &p
	}
	return j
}

func (s *Server) tasks(w http.ResponseWriter, r *http.Request) {
	q := etlcontext.TaskQuery{Limit: 100}
	if v := r.URL.Query().Get("status"); v != "" {
		for _, st := range strings.Split(v, ",") {
			q.Statuses = append(q.Statuses, etlcontext.Status(strings.ToUpper(st)))
		}
	}
	if v := r.URL.Query().Get("q"); v != "" {
		if id, err := strconv.ParseInt(v, 10, 64); err == nil {
			q.ID = id
		}
	}
	tasks, err := etlcontext.Tasks(r.Context(), s.pool, q)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	kind, queue := r.URL.Query().Get("kind"), r.URL.Query().Get("queue")
	out := []taskJSON{}
	for _, t := range tasks {
		// TODO(issue 9): filter kind and queue in the query, with an index.
		if (kind == "" || t.Kind == kind) && (queue == "" || t.Queue == queue) {
			out = append(out, withBar(t))
		}
	}
	writeJSON(w, map[string]any{"tasks": out, "now": time.Now()})
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid task id %q", r.PathValue("id"))
	}
	return id, nil
}

func (s *Server) task(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	ctx := r.Context()
	tasks, err := etlcontext.Tasks(ctx, s.pool, etlcontext.TaskQuery{ID: id})
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err)
		return
	case len(tasks) == 0:
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d not found", id))
		return
	}
	events, err := etlcontext.Events(ctx, s.pool, id)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	children, err := etlcontext.Tasks(ctx, s.pool, etlcontext.TaskQuery{ParentID: id, Limit: 200})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	args, checkpoint, err := etlcontext.Payloads(ctx, s.pool, id)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	kids := make([]taskJSON, 0, len(children))
	for _, c := range children {
		kids = append(kids, withBar(c))
	}
	writeJSON(w, map[string]any{
		"task": withBar(tasks[0]), "events": events, "children": kids,
		"args": args, "checkpoint": checkpoint,
		"log_here": tasks[0].HostID != nil && *tasks[0].HostID == s.hostID,
	})
}

// maxLogChunk bounds what one log request returns.
const maxLogChunk = 64 << 10

// log returns the task's log from ?offset=, when the task ran on this host.
func (s *Server) log(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	tasks, err := etlcontext.Tasks(r.Context(), s.pool, etlcontext.TaskQuery{ID: id})
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err)
		return
	case len(tasks) == 0:
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d not found", id))
		return
	}
	t := tasks[0]
	if t.HostID == nil || *t.HostID != s.hostID || t.LogPath == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d's log is on host %s", id, deref(t.Host)))
		return
	}
	offset, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	f, err := os.Open(*t.LogPath)
	if err != nil {
		writeError(w, http.StatusNotFound, err)
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if offset < 0 || offset > info.Size() {
		offset = 0
	}
	if offset == 0 && info.Size() > maxLogChunk {
		offset = info.Size() - maxLogChunk
	}
	buf := make([]byte, min(info.Size()-offset, maxLogChunk))
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, map[string]any{"data": strings.ToValidUTF8(string(buf[:n]), "\uFFFD"), "next": offset + int64(n), "finished": t.Status.Finished()})
}

func (s *Server) queues(w http.ResponseWriter, r *http.Request) {
	stats, err := etlcontext.QueueStats(r.Context(), s.pool)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, map[string]any{"queues": stats})
}

// action guards an action: on, with the token, and from this page.
func (s *Server) action(h func(ctx context.Context, r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.opts.ReadOnly {
			writeError(w, http.StatusForbidden, errors.New("this page is read-only"))
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
			writeError(w, http.StatusForbidden, errors.New("cross-site request refused"))
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(TokenHeader)), []byte(s.opts.Token)) != 1 {
			writeError(w, http.StatusUnauthorized, errors.New("a valid token is needed for actions"))
			return
		}
		v, err := h(r.Context(), r)
		if err != nil {
			writeError(w, http.StatusConflict, err)
			return
		}
		writeJSON(w, v)
	}
}

func (s *Server) cancel(ctx context.Context, r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	status, err := s.client.Cancel(ctx, id)
	return map[string]any{"status": status}, err
}

func (s *Server) retry(ctx context.Context, r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	return map[string]any{"status": etlcontext.StatusQueued}, s.client.Retry(ctx, id)
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
