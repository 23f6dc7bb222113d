package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/etlcontext"
)

// actionFunc does an action for the client c, which records who asked.
type actionFunc func(ctx context.Context, c *dama.Client, r *http.Request, reason string) (any, error)

// action guards an action: actions on, the token given, the request from
// this page. The optional JSON body {"reason": ...} gives a pause's or a
// block's reason.
func (s *Server) action(do actionFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// A client that sends or reads slowly holds an action's slot no
		// longer than actionTimeout, and writeGrace.
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
		writeJSON(w, http.StatusOK, v)
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
	if !matches(r.Header.Get(TokenHeader), s.tokenSum) {
		return http.StatusUnauthorized, errors.New("a valid token is needed for actions")
	}
	return 0, nil
}

// actor names who acts: the name given on the page, quoted (a label, not
// an identity), this page's host, and the address the request came from.
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

func (s *Server) cancel(ctx context.Context, c *dama.Client, r *http.Request, _ string) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	// Not Cancel, which waits for the task to stop: the page shows it.
	status, err := c.RequestCancel(ctx, id)
	return map[string]any{"status": status}, err
}

func (s *Server) retry(ctx context.Context, c *dama.Client, r *http.Request, _ string) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := c.Retry(ctx, id); err != nil {
		return nil, err
	}
	return map[string]any{"status": etlcontext.StatusQueued}, nil
}

func (s *Server) pause(ctx context.Context, c *dama.Client, r *http.Request, reason string) (any, error) {
	return c.PauseQueue(ctx, r.PathValue("queue"), reason)
}

func (s *Server) resume(ctx context.Context, c *dama.Client, r *http.Request, _ string) (any, error) {
	resumed, err := c.ResumeQueue(ctx, r.PathValue("queue"))
	return map[string]any{"resumed": resumed}, err
}

func (s *Server) block(ctx context.Context, c *dama.Client, r *http.Request, reason string) (any, error) {
	if reason == "" {
		return nil, fmt.Errorf("%w: a block needs a reason", errInvalid)
	}
	return c.BlockKind(ctx, r.PathValue("kind"), reason)
}

func (s *Server) unblock(ctx context.Context, c *dama.Client, r *http.Request, _ string) (any, error) {
	unblocked, err := c.UnblockKind(ctx, r.PathValue("kind"))
	return map[string]any{"unblocked": unblocked}, err
}
