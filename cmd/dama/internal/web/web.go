package web

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
)

//go:embed assets
var assets embed.FS

const (
	// TokenHeader carries the action token from the page's script.
	TokenHeader = "X-Dama-Token"
	// ActorHeader carries the name the operator gave on the page, recorded
	// with each action.
	ActorHeader = "X-Dama-Actor"
	// MinTokenLength is the shortest token New accepts.
	MinTokenLength = 16
)

// Limits of what one request reads, so that a page left open on a
// database of millions of tasks costs the same as on a new one.
const (
	taskPage = 100
	// countCap bounds each count of the tasks by status ("10000+").
	countCap = 10000
	// chartSpan is how far back the chart of finished tasks reaches.
	chartSpan     = 24 * time.Hour
	childrenPage  = 200
	eventsPage    = 200
	controlEvents = 50
	maxLogChunk   = 64 << 10
	maxActorName  = 64
	readTimeout   = 10 * time.Second
	actionTimeout = 30 * time.Second
	// writeGrace is how long, past its read's or action's time, a reply
	// may take to be written: a slow client holds a slot no longer.
	writeGrace = 5 * time.Second
	// maxActions bounds the actions served at once: each holds a
	// connection of the pool, which the page's reads need too.
	maxActions = 4
	// maxReads bounds the reads served at once; more wait, within readTimeout.
	maxReads = 8
	// maxReplies bounds the reads' replies in memory (each at most about
	// maxResponse, an event's twice maxEvent): clients that do not read
	// hold this many at most, each writeGrace past its readTimeout.
	maxReplies = 64
	// maxPayload is the most of each event payload, meta or progress a
	// page's read returns (the rest is read event by event); maxText, of
	// an attempt's reason and log tail.
	maxPayload   = 2 << 10
	maxText      = 4 << 10
	attemptsPage = 100
	// maxResponse is the most a task's read returns (taskReply).
	maxResponse = 1 << 20
	// maxEvent is the most of an event's payload, and of its meta, that
	// its own read returns: an event from the pipe is far smaller (a line
	// is at most 1 MiB), one written by SQL may not be.
	maxEvent = 8 << 20
)

// StatementTimeout is the statement_timeout a page's pool sets, the
// longest a read or an action may need: a request given up on stops its
// statement on the server too.
const StatementTimeout = actionTimeout

// ReadTokenHeader carries the read token (Options.ReadToken).
const ReadTokenHeader = "X-Dama-Read-Token"

// LoginParam is the query parameter of a login link: GET /?token=…, with
// the read token or the action token, sets LoginCookie to it and
// redirects to the same page without it, as Jupyter's link does.
const (
	LoginParam  = "token"
	LoginCookie = "dama_token"
)

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
	// /metrics, in LoginCookie (which a login link sets), in ReadTokenHeader
	// or as "Authorization: Bearer"; the action token also reads. Empty:
	// reads need none. It must be at least MinTokenLength long.
	ReadToken string
	// AllowedHosts, when not empty, are the host names (or addresses) the
	// page answers to, so that another site cannot read it through DNS
	// rebinding; "localhost" allows every loopback name and address. Empty
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
	client *dama.Client
	opts   Options
	hostID string
	host   string
	// The tokens' SHA-256 (matches).
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
	client, err := dama.NewClient(pool, cfg)
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
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, static, page)
		})
	}
	s.mux.HandleFunc("GET /api/config", s.read(s.config))
	s.mux.HandleFunc("GET /api/tasks", s.read(s.tasks))
	s.mux.HandleFunc("GET /api/tasks/{id}", s.read(s.task))
	s.mux.HandleFunc("GET /api/finished", s.read(s.finished))
	s.mux.HandleFunc("GET /api/tasks/{id}/log", s.read(s.log))
	s.mux.HandleFunc("GET /api/tasks/{id}/events/{event}", s.read(s.event))
	s.mux.HandleFunc("GET /api/queues", s.read(s.queues))
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
	// An action sets its own deadline.
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
	if r.Method == http.MethodGet && r.URL.Query().Has(LoginParam) {
		s.login(w, r)
		return
	}
	// HEAD is served by the GET handlers: it is bounded and guarded alike.
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		if api := strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/metrics"; api {
			// Another site cannot read the reply, but could make the
			// database count and scan for it, through the browser of an
			// operator of a page with public reads.
			if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
				writeError(w, http.StatusForbidden, fmt.Errorf("cross-site read refused (Sec-Fetch-Site: %s)", site))
				return
			}
			if !s.mayRead(r) {
				writeError(w, http.StatusUnauthorized, errors.New("a valid read token is needed: open the login link dama web printed when it started"))
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
			// The reply is made in memory while the read holds its slot,
			// and written once the slot is free: a slow client holds none.
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

// mayRead reports whether r may read the API: always, unless a read token
// is set, which r must carry (or the action token).
func (s *Server) mayRead(r *http.Request) bool {
	if s.opts.ReadToken == "" {
		return true
	}
	candidates := []string{r.Header.Get(ReadTokenHeader), r.Header.Get(TokenHeader)}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		candidates = append(candidates, bearer) // as Prometheus sends it
	}
	// Every cookie of the name: another site of the host (a page on
	// another port) may have set one too.
	for _, c := range r.CookiesNamed(LoginCookie) {
		if token, err := base64.RawURLEncoding.DecodeString(c.Value); err == nil {
			candidates = append(candidates, string(token))
		}
	}
	return slices.ContainsFunc(candidates, s.tokenReads)
}

// tokenReads reports whether token is one that reads: the read token, or
// the action token of a page with actions.
func (s *Server) tokenReads(token string) bool {
	return token != "" && (matches(token, s.readTokenSum) || (!s.opts.ReadOnly && matches(token, s.tokenSum)))
}

// matches reports whether token's SHA-256 is sum: comparing sums of equal
// length, in constant time, tells nothing of the token.
func matches(token string, sum [sha256.Size]byte) bool {
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], sum[:]) == 1
}

// login serves a login link: its read token is kept in an HttpOnly cookie,
// which no script reads, sent with this site's requests and links
// (SameSite=Lax), and the browser is sent to the same page without the
// token in its address, history or Referer. Browsers send a cookie to
// every port of the host, to another server's pages too: the action
// token, which writes, is never put in it.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if token := r.URL.Query().Get(LoginParam); s.opts.ReadToken != "" {
		if !matches(token, s.readTokenSum) {
			writeError(w, http.StatusUnauthorized, errors.New("this login link's token is not the page's read token: open the link dama web printed when it started"))
			return
		}
		// Encoded: a cookie's value holds only some bytes.
		http.SetCookie(w, &http.Cookie{Name: LoginCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(token)), Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	q := r.URL.Query()
	q.Del(LoginParam)
	// One leading slash: "//host" would send the browser to another site.
	to := url.URL{Path: "/" + strings.TrimLeft(r.URL.Path, "/"), RawQuery: q.Encode()}
	http.Redirect(w, r, to.String(), http.StatusSeeOther)
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
