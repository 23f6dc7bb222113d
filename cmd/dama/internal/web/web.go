// Package web serves dama's status page (`dama web`): the tasks, a task's
// arguments, events, attempts and log, the queues, and the operator's
// actions, over the same database as the supervisors. It reads the views
// and the event store, never a task's lock, so it blocks no task.
//
// The pages are static files embedded in the binary; a small script reads
// the JSON API under /api/ every second. Actions are POST requests that
// carry the token in TokenHeader: a cross-site form cannot set a header,
// and a cross-site script cannot without a CORS preflight, which the
// server never grants.
package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

//go:embed assets
var assets embed.FS

const (
	// TokenHeader carries the action token from the page's script.
	TokenHeader = "X-Dama-Token"
	// ActorHeader carries the name the operator gave on the page, recorded
	// with each action together with where the request came from.
	ActorHeader = "X-Dama-Actor"
	// MinTokenLength is the shortest token New accepts.
	MinTokenLength = 16
)

// Limits of what one request reads, so that a page left open on a
// database of millions of tasks costs the same as on a new one.
const (
	taskPage      = 100
	childrenPage  = 200
	eventsPage    = 200
	controlEvents = 50
	maxLogChunk   = 64 << 10
	maxActorName  = 64
	readTimeout   = 10 * time.Second
	actionTimeout = 30 * time.Second
	// writeGrace is how long, past its read's or action's time, a reply
	// may take to be written: a client that reads it no faster holds a
	// slot no longer.
	writeGrace = 5 * time.Second
	// maxActions bounds the actions served at once: each holds a
	// connection of the pool, which the page's reads need too.
	maxActions = 4
	// maxReads bounds the reads served at once; more wait, within
	// readTimeout.
	maxReads = 8
	// maxReplies bounds the reads' replies in memory, made or being
	// written (each at most about maxResponse, an event's about twice
	// maxEvent): a flood of clients that do
	// not read holds at most this many, each for at most writeGrace past
	// its readTimeout.
	maxReplies = 64
	// maxPayload is the most of each event payload, meta or progress a
	// page's read returns: the rest is fetched event by event
	// (GET /api/tasks/{id}/events/{event}). maxText bounds an attempt's
	// reason and log tail; attemptsPage the attempts shown.
	maxPayload   = 2 << 10
	maxText      = 4 << 10
	attemptsPage = 100
	// maxResponse is the most a task's read returns: past it, the oldest
	// of its events are left out.
	maxResponse = 1 << 20
	// maxEvent is the most of an event's payload, and of its meta, that
	// its own read returns: an event from the pipe is far smaller (a line
	// is at most 1 MiB), one written by SQL may not be.
	maxEvent = 8 << 20
)

// ReadTokenHeader carries the read token (Options.ReadToken).
const ReadTokenHeader = "X-Dama-Read-Token"

// errInvalid marks a request the server cannot read: a 400.
var errInvalid = errors.New("invalid request")

// Options configure a Server.
type Options struct {
	// Token allows the actions to a request carrying it in TokenHeader. It
	// must be at least MinTokenLength long unless ReadOnly is set.
	Token string
	// ReadOnly turns every action off; Token is then ignored.
	ReadOnly bool
	// ReadToken, when set, is needed for every read of the API and of
	// /metrics too, in ReadTokenHeader (the action token also does), for
	// a page served beyond this host. Empty, the default: reads need
	// none. It must be at least MinTokenLength long.
	ReadToken string
	// AllowedHosts, when not empty, are the host names (or addresses) the
	// page answers to: a request whose Host header names another is
	// refused, so that another site cannot read the page through DNS
	// rebinding. "localhost" allows every loopback name and address. Empty
	// answers every Host (behind a proxy that checks it).
	AllowedHosts []string
	// Metrics, when set, is served on GET /metrics, behind the same Host
	// check and headers as the page.
	Metrics http.Handler
	// Logger receives a line per action; nil means slog.Default().
	Logger *slog.Logger
}

// Server is the status page's HTTP handler.
type Server struct {
	pool   *pgxpool.Pool
	cfg    *config.Config
	client *supervisor.Client
	opts   Options
	hostID string
	host   string
	// tokenSum is the token's SHA-256: comparing sums of equal length
	// tells nothing of the token's length.
	tokenSum, readTokenSum  [sha256.Size]byte
	actions, reads, replies chan struct{}
	mux                     *http.ServeMux
}

// ErrNoToken is returned by New for actions without a token long enough.
var ErrNoToken = fmt.Errorf("actions need a token of at least %d characters", MinTokenLength)

// New returns the page's handler over pool, with cfg's kinds and queues.
func New(pool *pgxpool.Pool, cfg *config.Config, opts Options) (*Server, error) {
	if !opts.ReadOnly && len(opts.Token) < MinTokenLength {
		return nil, ErrNoToken
	}
	if opts.ReadToken != "" && len(opts.ReadToken) < MinTokenLength {
		return nil, fmt.Errorf("the read token is too short: at least %d characters", MinTokenLength)
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
		return nil, fmt.Errorf("identify this host: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("read host name: %w", err)
	}
	s := &Server{
		pool: pool, cfg: cfg, client: client, opts: opts, hostID: hostID, host: host,
		tokenSum: sha256.Sum256([]byte(opts.Token)), readTokenSum: sha256.Sum256([]byte(opts.ReadToken)),
		actions: make(chan struct{}, maxActions), reads: make(chan struct{}, maxReads), replies: make(chan struct{}, maxReplies),
		mux: http.NewServeMux(),
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	for path, page := range map[string]string{"GET /{$}": "index.html", "GET /tasks/{id}": "task.html", "GET /queues": "queues.html"} {
		s.mux.HandleFunc(path, s.page(page))
	}
	s.mux.HandleFunc("GET /api/config", s.config)
	s.mux.HandleFunc("GET /api/tasks", s.tasks)
	s.mux.HandleFunc("GET /api/tasks/{id}", s.task)
	s.mux.HandleFunc("GET /api/tasks/{id}/log", s.log)
	s.mux.HandleFunc("GET /api/tasks/{id}/events/{event}", s.event)
	s.mux.HandleFunc("GET /api/queues", s.queues)
	s.mux.HandleFunc("POST /api/tasks/{id}/cancel", s.action(s.cancel))
	s.mux.HandleFunc("POST /api/tasks/{id}/retry", s.action(s.retry))
	s.mux.HandleFunc("POST /api/queues/{queue}/pause", s.action(s.pause))
	s.mux.HandleFunc("POST /api/queues/{queue}/resume", s.action(s.resume))
	s.mux.HandleFunc("POST /api/kinds/{kind}/block", s.action(s.block))
	s.mux.HandleFunc("POST /api/kinds/{kind}/unblock", s.action(s.unblock))
	if opts.Metrics != nil {
		s.mux.Handle("GET /metrics", opts.Metrics)
	}
	return s, nil
}

// ServeHTTP serves the page, its API and /metrics, to a request naming an
// allowed host.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every reply is written within a read's time and writeGrace (an
	// action sets its own): a client that does not read it holds a
	// connection no longer.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(readTimeout + writeGrace))
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
	if !s.hostAllowed(r.Host) {
		s.opts.Logger.Warn("request refused", "host", r.Host, "path", r.URL.Path, "remote", r.RemoteAddr)
		writeError(w, http.StatusMisdirectedRequest, fmt.Errorf("host %q refused: this page answers to %s", r.Host, strings.Join(s.opts.AllowedHosts, ", ")))
		return
	}
	// HEAD is served by the GET handlers: it is bounded and guarded alike.
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		if api := strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/metrics"; api {
			if !s.mayRead(r) {
				writeError(w, http.StatusUnauthorized, errors.New("a valid read token is needed"))
				return
			}
			select {
			case s.replies <- struct{}{}:
				defer func() { <-s.replies }()
			case <-ctx.Done():
				writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d replies are being written: try again", maxReplies))
				return
			}
			select {
			case s.reads <- struct{}{}:
			case <-ctx.Done():
				writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d reads are under way: try again", maxReads))
				return
			}
			// The reply is made in memory (at most about maxResponse)
			// while the read holds its slot, and written once the slot is
			// free: a client that reads slowly holds none.
			reply := &bufferedReply{header: w.Header()}
			func() {
				defer func() { <-s.reads }()
				s.mux.ServeHTTP(reply, r)
			}()
			reply.writeTo(w)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

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

// mayRead reports whether r may read the API: always, unless a read token
// is set, which r must carry (or the action token).
func (s *Server) mayRead(r *http.Request) bool {
	if s.opts.ReadToken == "" {
		return true
	}
	token := r.Header.Get(ReadTokenHeader)
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && token == "" {
		token = bearer // as Prometheus sends it
	}
	// The page sends its one token field as the read token: the action
	// token reads too.
	for _, t := range []string{token, r.Header.Get(TokenHeader)} {
		sum := sha256.Sum256([]byte(t))
		if subtle.ConstantTimeCompare(sum[:], s.readTokenSum[:]) == 1 ||
			(!s.opts.ReadOnly && subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1) {
			return true
		}
	}
	return false
}

func (s *Server) hostAllowed(hostport string) bool {
	if len(s.opts.AllowedHosts) == 0 {
		return true
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	ip := net.ParseIP(host)
	for _, allowed := range s.opts.AllowedHosts {
		allowed = strings.ToLower(strings.Trim(allowed, "[]"))
		switch {
		case allowed == "localhost" && (host == "localhost" || (ip != nil && ip.IsLoopback())):
			return true
		case host == allowed:
			return true
		case ip != nil && ip.Equal(net.ParseIP(allowed)):
			return true
		}
	}
	return false
}

func (s *Server) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	}
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
	case errors.Is(err, etlcontext.ErrNotFound), errors.Is(err, supervisor.ErrUnknownQueue):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, context.DeadlineExceeded), pgerr.Unreachable(err):
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeError(w, http.StatusConflict, err)
	}
}

// config tells the page what it may offer: the actions, and the queues and
// kinds of the configuration.
func (s *Server) config(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{
		"read_only": s.opts.ReadOnly,
		"host":      s.host,
		"queues":    s.cfg.QueueNames(),
		"kinds":     s.cfg.KindNames(),
	})
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

func withBars(tasks []etlcontext.Task) []taskJSON {
	out := make([]taskJSON, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, withBar(t))
	}
	return out
}

// tasks lists the newest tasks, filtered by ?status= (comma-separated),
// ?kind=, ?queue=, and ?q=, an id or an idempotency key.
func (s *Server) tasks(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q := etlcontext.TaskQuery{Limit: taskPage, Kind: v.Get("kind"), Queue: v.Get("queue"), MaxPayload: maxPayload}
	if st := v.Get("status"); st != "" {
		for _, name := range strings.Split(st, ",") {
			status := etlcontext.Status(strings.ToUpper(strings.TrimSpace(name)))
			if !slices.Contains(etlcontext.Statuses, status) {
				readError(w, fmt.Errorf("%w: unknown status %q", errInvalid, name))
				return
			}
			q.Statuses = append(q.Statuses, status)
		}
	}
	search := strings.TrimSpace(v.Get("q"))
	var tasks []etlcontext.Task
	if id, err := strconv.ParseInt(search, 10, 64); err == nil && id > 0 {
		byID := q
		byID.ID = id
		found, err := etlcontext.Tasks(r.Context(), s.pool, byID)
		if err != nil {
			readError(w, err)
			return
		}
		tasks = found
	}
	if search != "" && len(tasks) == 0 {
		q.IdempotencyKey = search
	}
	if search == "" || len(tasks) == 0 {
		found, err := etlcontext.Tasks(r.Context(), s.pool, q)
		if err != nil {
			readError(w, err)
			return
		}
		tasks = found
	}
	writeJSON(w, map[string]any{"tasks": withBars(tasks), "limit": taskPage})
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: task id %q", errInvalid, r.PathValue("id"))
	}
	return id, nil
}

// oneTask reads the task of the request's path.
func (s *Server) oneTask(r *http.Request) (etlcontext.Task, error) {
	id, err := pathID(r)
	if err != nil {
		return etlcontext.Task{}, err
	}
	tasks, err := etlcontext.Tasks(r.Context(), s.pool, etlcontext.TaskQuery{ID: id, MaxPayload: maxPayload})
	if err != nil {
		return etlcontext.Task{}, err
	}
	if len(tasks) == 0 {
		return etlcontext.Task{}, fmt.Errorf("task %d: %w", id, etlcontext.ErrNotFound)
	}
	return tasks[0], nil
}

func (s *Server) task(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, err := s.oneTask(r)
	if err != nil {
		readError(w, err)
		return
	}
	events, err := etlcontext.RecentEvents(ctx, s.pool, t.ID, eventsPage, maxPayload)
	if err != nil {
		readError(w, err)
		return
	}
	attempts, err := etlcontext.RecentAttempts(ctx, s.pool, t.ID, attemptsPage, maxText)
	if err != nil {
		readError(w, err)
		return
	}
	children, err := etlcontext.Tasks(ctx, s.pool, etlcontext.TaskQuery{ParentID: t.ID, Limit: childrenPage, MaxPayload: maxPayload})
	if err != nil {
		readError(w, err)
		return
	}
	args, checkpoint, err := etlcontext.Payloads(ctx, s.pool, t.ID)
	if err != nil {
		readError(w, err)
		return
	}
	b, err := taskReply(map[string]any{
		"task": withBar(t), "events_limit": eventsPage, "attempts_limit": attemptsPage, "children_limit": childrenPage,
		"args": args, "checkpoint": checkpoint, "log_here": s.logHere(t),
	}, events, attempts, withBars(children), maxResponse)
	if err != nil {
		readError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// taskReply encodes a task's read, reply with its events, attempts and
// children (oldest first, oldest first, newest first), within max bytes.
// Each value is bounded, but their sum may not be: the oldest events give
// way, then the oldest attempts, then the oldest children, halving, and
// reply says which ("events_cut", ...). What is left (the task, its
// arguments and checkpoint, its newest attempt) is a few hundred KiB.
func taskReply[E, A, C any](reply map[string]any, events []E, attempts []A, children []C, max int) ([]byte, error) {
	for {
		reply["events"], reply["attempts"], reply["children"] = events, attempts, children
		b, err := marshal(reply)
		if err != nil || len(b) <= max {
			return b, err
		}
		switch {
		case len(events) > 0:
			events = events[len(events)/2+len(events)%2:]
			reply["events_cut"] = true
		case len(attempts) > 1:
			attempts = attempts[len(attempts)/2:]
			reply["attempts_cut"] = true
		case len(children) > 0:
			children = children[:len(children)/2]
			reply["children_cut"] = true
		default:
			return b, nil
		}
	}
}

// event returns one event of a task, whole: what the task's read cut short.
func (s *Server) event(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		readError(w, err)
		return
	}
	eventID, err := strconv.ParseInt(r.PathValue("event"), 10, 64)
	if err != nil || eventID <= 0 {
		readError(w, fmt.Errorf("%w: event id %q", errInvalid, r.PathValue("event")))
		return
	}
	e, err := etlcontext.EventOf(r.Context(), s.pool, id, eventID, maxEvent)
	if err != nil {
		readError(w, err)
		return
	}
	writeJSON(w, e)
}

// logHere reports whether the task's log is on this host, where the page
// can read it.
func (s *Server) logHere(t etlcontext.Task) bool {
	return t.HostID != nil && *t.HostID == s.hostID && t.LogPath != nil
}

// log returns up to maxLogChunk bytes of the task's log from ?offset=, or
// its last maxLogChunk bytes without one; "next" is the offset to ask for
// next. Only for a task that ran on this host.
func (s *Server) log(w http.ResponseWriter, r *http.Request) {
	t, err := s.oneTask(r)
	if err != nil {
		readError(w, err)
		return
	}
	if !s.logHere(t) {
		host := "-"
		if t.Host != nil {
			host = *t.Host
		}
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d's log is on host %s", t.ID, host))
		return
	}
	// Anyone who reaches the page reads this, so only a regular file named
	// as dama names logs, reached without following a link the task could
	// have put in its place, and without blocking on a FIFO.
	if filepath.Base(*t.LogPath) != protocol.LogName(t.ID) {
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d's log %s is not a dama log", t.ID, *t.LogPath))
		return
	}
	f, err := os.OpenFile(*t.LogPath, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("open the log of task %d: %w", t.ID, err))
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("read the log of task %d: %w", t.ID, err))
		return
	}
	if !info.Mode().IsRegular() {
		writeError(w, http.StatusNotFound, fmt.Errorf("task %d's log %s is not a regular file", t.ID, *t.LogPath))
		return
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || offset < 0 || offset > info.Size() {
		// A first read, or a log that was truncated: its last chunk.
		offset = max(info.Size()-maxLogChunk, 0)
	}
	buf := make([]byte, min(info.Size()-offset, maxLogChunk))
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("read the log of task %d: %w", t.ID, err))
		return
	}
	writeJSON(w, map[string]any{
		"data":     strings.ToValidUTF8(string(buf[:n]), "\uFFFD"),
		"offset":   offset,
		"next":     offset + int64(n),
		"finished": t.Status.Finished(),
	})
}

func (s *Server) queues(w http.ResponseWriter, r *http.Request) {
	stats, err := etlcontext.QueueStats(r.Context(), s.pool)
	if err != nil {
		readError(w, err)
		return
	}
	history, err := etlcontext.ControlEvents(r.Context(), s.pool, controlEvents)
	if err != nil {
		readError(w, err)
		return
	}
	writeJSON(w, map[string]any{"queues": stats, "history": history})
}

// actionFunc does an action for the client c, which records who asked.
type actionFunc func(ctx context.Context, c *supervisor.Client, r *http.Request, reason string) (any, error)

// action guards an action: actions on, the token given, the request from
// this page. The optional JSON body {"reason": ...} gives a pause's or a
// block's reason.
func (s *Server) action(do actionFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// An action, from its body's reading to its reply's writing, takes
		// at most actionTimeout (and writeGrace to write the reply): a client
		// that sends or reads slowly holds an action's slot no longer.
		deadline := time.Now().Add(actionTimeout)
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(deadline)
		_ = rc.SetWriteDeadline(deadline.Add(writeGrace))
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		defer cancel()
		if code, err := s.refuse(r); err != nil {
			s.opts.Logger.Warn("action refused", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
			writeError(w, code, err)
			return
		}
		select {
		case s.actions <- struct{}{}:
			defer func() { <-s.actions }()
		default:
			writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d actions are under way: try again", maxActions))
			return
		}
		var body struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
				actionError(w, fmt.Errorf("%w: read the body: %v", errInvalid, err))
				return
			}
		}
		actor := s.actor(r)
		v, err := do(ctx, s.client.WithActor(actor), r, strings.TrimSpace(body.Reason))
		s.opts.Logger.Info("action", "path", r.URL.Path, "actor", actor, "error", err)
		if err != nil {
			actionError(w, err)
			return
		}
		writeJSON(w, v)
	}
}

// refuse says why an action request is refused, if it is.
func (s *Server) refuse(r *http.Request) (int, error) {
	if s.opts.ReadOnly {
		return http.StatusForbidden, errors.New("this page is read-only")
	}
	// Browsers name the requesting site; a request from another one is
	// refused even if it somehow carried the token.
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return http.StatusForbidden, fmt.Errorf("cross-site request refused (Sec-Fetch-Site: %s)", site)
	}
	sum := sha256.Sum256([]byte(r.Header.Get(TokenHeader)))
	if subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) != 1 {
		return http.StatusUnauthorized, errors.New("a valid token is needed for actions")
	}
	return 0, nil
}

// actor names who acts: the name given on the page, quoted (anyone with
// the token may claim any name: it is a label, not an identity), this
// page's host, and the address the request came from.
func (s *Server) actor(r *http.Request) string {
	name := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.TrimSpace(r.Header.Get(ActorHeader)))
	if len(name) > maxActorName {
		name = strings.ToValidUTF8(name[:maxActorName], "")
	}
	if name == "" {
		name = "anonymous"
	}
	from, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		from = r.RemoteAddr
	}
	return fmt.Sprintf("%q via dama web on %s from %s", name, s.host, from)
}

func (s *Server) cancel(ctx context.Context, c *supervisor.Client, r *http.Request, _ string) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	// Not Cancel, which waits for the task to stop: the page shows it.
	status, err := c.RequestCancel(ctx, id)
	return map[string]any{"status": status}, err
}

func (s *Server) retry(ctx context.Context, c *supervisor.Client, r *http.Request, _ string) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := c.Retry(ctx, id); err != nil {
		return nil, err
	}
	return map[string]any{"status": etlcontext.StatusQueued}, nil
}

func (s *Server) pause(ctx context.Context, c *supervisor.Client, r *http.Request, reason string) (any, error) {
	return c.PauseQueue(ctx, r.PathValue("queue"), reason)
}

func (s *Server) resume(ctx context.Context, c *supervisor.Client, r *http.Request, _ string) (any, error) {
	resumed, err := c.ResumeQueue(ctx, r.PathValue("queue"))
	return map[string]any{"resumed": resumed}, err
}

func (s *Server) block(ctx context.Context, c *supervisor.Client, r *http.Request, reason string) (any, error) {
	if reason == "" {
		return nil, fmt.Errorf("%w: a block needs a reason", errInvalid)
	}
	return c.BlockKind(ctx, r.PathValue("kind"), reason)
}

func (s *Server) unblock(ctx context.Context, c *supervisor.Client, r *http.Request, _ string) (any, error) {
	unblocked, err := c.UnblockKind(ctx, r.PathValue("kind"))
	return map[string]any{"unblocked": unblocked}, err
}
