package web

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/logdir"
)

// config tells the page what it may offer: the actions, the queues, and
// the kinds of the configuration and those supervisors published.
func (s *Server) config(r *http.Request) (any, error) {
	published, err := etlcontext.Kinds(r.Context(), s.pool)
	if err != nil {
		return nil, err
	}
	kinds := s.cfg.KindNames()
	for _, k := range published {
		kinds = append(kinds, k.Kind)
	}
	slices.Sort(kinds)
	return map[string]any{
		"read_only": s.opts.ReadOnly,
		"host":      s.host,
		"queues":    s.cfg.QueueNames(),
		"kinds":     slices.Compact(kinds),
	}, nil
}

// taskJSON is a task as the page shows it: its progress read as a bar,
// why it is where it is, and the time it has left at its pace.
type taskJSON struct {
	etlcontext.Task
	Bar    *etlcontext.Progress `json:"bar"`
	Reason etlcontext.Reason    `json:"reason"`
	// ETA is the seconds a running task has left, if its progress tells.
	ETA *float64 `json:"eta"`
}

// annotate reads the reasons and paces of tasks, in two statements.
func (s *Server) annotate(ctx context.Context, tasks []etlcontext.Task) ([]taskJSON, error) {
	out := make([]taskJSON, 0, len(tasks))
	if len(tasks) == 0 {
		return out, nil
	}
	var all, running []int64
	for _, t := range tasks {
		all = append(all, t.ID)
		if t.Status == etlcontext.StatusRunning {
			running = append(running, t.ID)
		}
	}
	troubles, err := etlcontext.Troubles(ctx, s.pool, all)
	if err != nil {
		return nil, err
	}
	var paces map[int64]etlcontext.Pace
	if len(running) > 0 {
		if paces, err = etlcontext.Paces(ctx, s.pool, running); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	for _, t := range tasks {
		j := taskJSON{Task: t, Reason: etlcontext.ReasonOf(t, troubles[t.ID], now)}
		if p, ok := etlcontext.ParseProgress(t.Progress); ok {
			j.Bar = &p
		}
		// Paces has the running tasks only.
		if left, ok := paces[t.ID].Remaining(t.Progress, t.ProgressAt, now); ok {
			j.ETA = new(left.Seconds())
		}
		out = append(out, j)
	}
	return out, nil
}

// tasks lists the newest tasks, filtered by ?status= (comma-separated),
// ?kind=, ?queue=, and ?q=, an id or an idempotency key; without a status,
// the running, retrying and queued first (etlcontext.TaskQuery.ActiveFirst).
// ?before= (the reply's next: an id, or STATUS:ID for those without a
// status; an id alone pages newest first) pages on. It counts the tasks of each status, up to countCap.
func (s *Server) tasks(r *http.Request) (any, error) {
	ctx := r.Context()
	v := r.URL.Query()
	q := etlcontext.TaskQuery{Limit: taskPage, Kind: v.Get("kind"), Queue: v.Get("queue"), MaxPayload: maxPayload, ActiveFirst: true}
	if st := v.Get("status"); st != "" {
		for _, name := range strings.Split(st, ",") {
			status := etlcontext.Status(strings.ToUpper(strings.TrimSpace(name)))
			if !slices.Contains(etlcontext.Statuses, status) {
				return nil, fmt.Errorf("%w: unknown status %q", errInvalid, name)
			}
			q.Statuses = append(q.Statuses, status)
		}
	}
	if b := v.Get("before"); b != "" {
		status, id, paired := strings.Cut(b, ":")
		if !paired {
			// An id alone pages newest first, whatever the status.
			status, id, q.ActiveFirst = "", b, false
		}
		before, err := strconv.ParseInt(id, 10, 64)
		if err != nil || before <= 0 || status != "" && !slices.Contains(etlcontext.Statuses, etlcontext.Status(status)) {
			return nil, fmt.Errorf("%w: before %q: a task id, or a status and an id (RUNNING:42)", errInvalid, b)
		}
		q.Before, q.BeforeStatus = before, etlcontext.Status(status)
	}
	search := strings.TrimSpace(v.Get("q"))
	var tasks []etlcontext.Task
	if id, err := strconv.ParseInt(search, 10, 64); err == nil && id > 0 {
		byID := q
		byID.ID = id
		if tasks, err = etlcontext.Tasks(ctx, s.pool, byID); err != nil {
			return nil, err
		}
	}
	if len(tasks) == 0 {
		// Not a task's id: an idempotency key, if anything.
		q.IdempotencyKey = search
		found, err := etlcontext.Tasks(ctx, s.pool, q)
		if err != nil {
			return nil, err
		}
		tasks = found
	}
	shown, err := s.annotate(ctx, tasks)
	if err != nil {
		return nil, err
	}
	reply := map[string]any{"tasks": shown, "limit": taskPage, "count_cap": countCap}
	// The counts are the tabs' numbers: without them (a statement cut
	// short on a loaded database) the list is still worth showing.
	if counts, err := etlcontext.CountByStatus(ctx, s.pool, etlcontext.TaskQuery{Kind: q.Kind, Queue: q.Queue}, countCap); err == nil {
		reply["counts"] = counts
	} else {
		s.opts.Logger.Warn("count the tasks by status", "error", err)
	}
	if len(tasks) == taskPage {
		last := tasks[len(tasks)-1]
		next := strconv.FormatInt(last.ID, 10)
		if q.ActiveFirst && len(q.Statuses) == 0 {
			next = string(last.Status) + ":" + next
		}
		reply["next"] = next
	}
	return reply, nil
}

// finished counts the tasks of ?kind= and ?queue= finished in the last
// day, per ?per=minute or hour (the default), for the page's chart.
func (s *Server) finished(r *http.Request) (any, error) {
	v := r.URL.Query()
	per := cmp.Or(v.Get("per"), "hour")
	if per != "minute" && per != "hour" {
		return nil, fmt.Errorf("%w: per %q: minute or hour", errInvalid, per)
	}
	since := time.Now().Add(-chartSpan)
	spans, err := etlcontext.FinishedPer(r.Context(), s.pool, etlcontext.TaskQuery{Kind: v.Get("kind"), Queue: v.Get("queue")}, per, since)
	return map[string]any{"per": per, "since": since, "spans": spans}, err
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

func (s *Server) task(r *http.Request) (any, error) {
	ctx := r.Context()
	t, err := s.oneTask(r)
	if err != nil {
		return nil, err
	}
	events, err := etlcontext.RecentEvents(ctx, s.pool, t.ID, eventsPage, maxPayload)
	if err != nil {
		return nil, err
	}
	attempts, err := etlcontext.RecentAttempts(ctx, s.pool, t.ID, attemptsPage, maxText)
	if err != nil {
		return nil, err
	}
	children, err := etlcontext.Tasks(ctx, s.pool, etlcontext.TaskQuery{ParentID: t.ID, Limit: childrenPage, MaxPayload: maxPayload})
	if err != nil {
		return nil, err
	}
	shown, err := s.annotate(ctx, append([]etlcontext.Task{t}, children...))
	if err != nil {
		return nil, err
	}
	args, checkpoint, err := etlcontext.Payloads(ctx, s.pool, t.ID)
	if err != nil {
		return nil, err
	}
	return taskReply(map[string]any{
		"task": shown[0], "events_limit": eventsPage, "attempts_limit": attemptsPage, "children_limit": childrenPage,
		"args": args, "checkpoint": checkpoint, "log_here": s.logHere(t),
	}, events, attempts, shown[1:], maxResponse)
}

// taskReply encodes a task's read, reply with its events, attempts and
// children (oldest first, oldest first, newest first), within max bytes:
// each is bounded, their sum may not be. The oldest events give way, then
// the oldest attempts, then children, halving, and reply says which
// ("events_cut", ...); what is always left is a few hundred KiB.
func taskReply[E, A, C any](reply map[string]any, events []E, attempts []A, children []C, max int) (json.RawMessage, error) {
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
func (s *Server) event(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	eventID, err := strconv.ParseInt(r.PathValue("event"), 10, 64)
	if err != nil || eventID <= 0 {
		return nil, fmt.Errorf("%w: event id %q", errInvalid, r.PathValue("event"))
	}
	return etlcontext.EventOf(r.Context(), s.pool, id, eventID, maxEvent)
}

// logHere reports whether the task's log is on this host, the one that
// ran its latest attempt (by its identity, or its name after a reboot).
func (s *Server) logHere(t etlcontext.Task) bool {
	return t.LogPath != nil && ((t.HostID != nil && *t.HostID == s.hostID) || (t.Host != nil && *t.Host == s.host))
}

// log returns up to maxLogChunk bytes of the task's log from ?offset=, or
// its last ones without; "next" is the offset to ask for next. From the
// log file when it is on this host ("source": "file", offsets in bytes),
// else from the tail the database keeps (offsets "<attempt>:<byte>").
func (s *Server) log(r *http.Request) (any, error) {
	t, err := s.oneTask(r)
	if err != nil {
		return nil, err
	}
	if s.logHere(t) {
		if f, err := logdir.OpenLog(*t.LogPath, t.ID); err == nil {
			defer f.Close()
			return fileLog(r, t, f)
		}
	}
	return s.keptLog(r, t)
}

func fileLog(r *http.Request, t etlcontext.Task, f *os.File) (any, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, internalError{fmt.Errorf("read the log of task %d: %w", t.ID, err)}
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || offset < 0 || offset > info.Size() {
		// A first read, or a log that was truncated: its last chunk.
		offset = max(info.Size()-maxLogChunk, 0)
	}
	buf := make([]byte, min(info.Size()-offset, maxLogChunk))
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, internalError{fmt.Errorf("read the log of task %d: %w", t.ID, err)}
	}
	return logPiece(t, "file", strings.ToValidUTF8(string(buf[:n]), "\uFFFD"),
		strconv.FormatInt(offset, 10), strconv.FormatInt(offset+int64(n), 10)), nil
}

// logPiece is a piece of t's log, data from offset, and where the next begins.
func logPiece(t etlcontext.Task, source, data, offset, next string) map[string]any {
	return map[string]any{"data": data, "offset": offset, "next": next, "finished": t.Status.Finished(), "source": source}
}

// keptLog is log from the tail the database keeps, without an offset the
// latest attempt's; a gap (output not kept) is said in the text.
func (s *Server) keptLog(r *http.Request, t etlcontext.Task) (any, error) {
	ctx := r.Context()
	pos, ok := parseLogPos(r.URL.Query().Get("offset"))
	if !ok {
		end, err := etlcontext.LogEnd(ctx, s.pool, t.ID)
		if err != nil {
			return nil, err
		}
		pos = etlcontext.LogPos{Attempt: end.Attempt, Offset: max(end.Offset-maxLogChunk, 0)}
	}
	pieces, err := etlcontext.LogSince(ctx, s.pool, t.ID, pos, maxLogChunk)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	next := pos
	// Bounded by the bytes of output read, not by the text: a gap's line
	// and invalid UTF-8 made U+FFFD add to it.
	used := 0
	for _, p := range pieces {
		room := maxLogChunk - used
		if room <= 0 {
			break // the rest is for the next read
		}
		switch {
		case p.Attempt != next.Attempt && p.Offset > 0:
			fmt.Fprintf(&text, "[dama: attempt %d: its first %d bytes are not kept]\n", p.Attempt, p.Offset)
		case p.Attempt == next.Attempt && p.Offset > next.Offset && ok:
			fmt.Fprintf(&text, "[dama: %d bytes are not kept]\n", p.Offset-next.Offset)
		}
		data := p.Data[:min(len(p.Data), room)]
		used += len(data)
		text.WriteString(strings.ToValidUTF8(string(data), "\uFFFD"))
		next = etlcontext.LogPos{Attempt: p.Attempt, Offset: p.Offset + int64(len(data))}
	}
	return logPiece(t, "database", text.String(), formatLogPos(pos), formatLogPos(next)), nil
}

// parseLogPos reads "<attempt>:<byte>", as keptLog writes a place in the
// tail the database keeps.
func parseLogPos(s string) (etlcontext.LogPos, bool) {
	a, o, found := strings.Cut(s, ":")
	attempt, err1 := strconv.Atoi(a)
	offset, err2 := strconv.ParseInt(o, 10, 64)
	if !found || err1 != nil || err2 != nil || attempt < 0 || offset < 0 {
		return etlcontext.LogPos{}, false
	}
	return etlcontext.LogPos{Attempt: attempt, Offset: offset}, true
}

func formatLogPos(p etlcontext.LogPos) string {
	return strconv.Itoa(p.Attempt) + ":" + strconv.FormatInt(p.Offset, 10)
}

func (s *Server) queues(r *http.Request) (any, error) {
	stats, err := etlcontext.QueueStats(r.Context(), s.pool)
	if err != nil {
		return nil, err
	}
	history, err := etlcontext.ControlEvents(r.Context(), s.pool, controlEvents)
	if err != nil {
		return nil, err
	}
	sups, err := etlcontext.Supervisors(r.Context(), s.pool)
	return map[string]any{"queues": stats, "history": history, "supervisors": sups}, err
}
