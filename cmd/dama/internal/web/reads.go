package web

import (
	"cmp"
	"context"
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

// config tells the page what it may offer: the actions, the queues of the
// configuration, and its kinds with those the supervisors published
// (data_manager.kinds).
func (s *Server) config(w http.ResponseWriter, r *http.Request) {
	published, err := etlcontext.Kinds(r.Context(), s.pool)
	if err != nil {
		readError(w, err)
		return
	}
	kinds := s.cfg.KindNames()
	for _, k := range published {
		if !slices.Contains(kinds, k.Kind) {
			kinds = append(kinds, k.Kind)
		}
	}
	slices.Sort(kinds)
	writeJSON(w, map[string]any{
		"read_only": s.opts.ReadOnly,
		"host":      s.host,
		"queues":    s.cfg.QueueNames(),
		"kinds":     kinds,
	})
}

// taskJSON is a task as the page shows it: its progress read as a bar,
// why it is where it is, and, while it runs, the time it has left at its
// pace.
type taskJSON struct {
	etlcontext.Task
	Bar    *etlcontext.Progress `json:"bar"`
	Reason etlcontext.Reason    `json:"reason"`
	// ETA is the seconds a running task has left, nil when its progress
	// does not tell.
	ETA *float64 `json:"eta"`
}

// annotate reads the reasons and paces of tasks, in two statements, and
// returns them as the page shows them.
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
	paces := map[int64]etlcontext.Pace{}
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
		if pace, ok := paces[t.ID]; ok {
			if left, ok := pace.Remaining(t.Progress, t.ProgressAt, now); ok {
				secs := left.Seconds()
				j.ETA = &secs
			}
		}
		out = append(out, j)
	}
	return out, nil
}

// tasks lists the newest tasks, filtered by ?status= (comma-separated),
// ?kind=, ?queue=, and ?q=, an id or an idempotency key; ?before= (an id)
// pages to older ones. It counts the tasks of each status, for the kind
// and queue, up to countCap each.
func (s *Server) tasks(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
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
	if b := v.Get("before"); b != "" {
		before, err := strconv.ParseInt(b, 10, 64)
		if err != nil || before <= 0 {
			readError(w, fmt.Errorf("%w: before %q: a task id", errInvalid, b))
			return
		}
		q.Before = before
	}
	search := strings.TrimSpace(v.Get("q"))
	var tasks []etlcontext.Task
	if id, err := strconv.ParseInt(search, 10, 64); err == nil && id > 0 {
		byID := q
		byID.ID = id
		found, err := etlcontext.Tasks(ctx, s.pool, byID)
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
		found, err := etlcontext.Tasks(ctx, s.pool, q)
		if err != nil {
			readError(w, err)
			return
		}
		tasks = found
	}
	shown, err := s.annotate(ctx, tasks)
	if err != nil {
		readError(w, err)
		return
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
		reply["next"] = strconv.FormatInt(tasks[len(tasks)-1].ID, 10)
	}
	writeJSON(w, reply)
}

// finished counts the tasks of ?kind= and ?queue= finished in the last
// day, per ?per=minute or hour (the default), for the page's chart.
func (s *Server) finished(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	per := cmp.Or(v.Get("per"), "hour")
	if per != "minute" && per != "hour" {
		readError(w, fmt.Errorf("%w: per %q: minute or hour", errInvalid, per))
		return
	}
	since := time.Now().Add(-chartSpan)
	spans, err := etlcontext.FinishedPer(r.Context(), s.pool, etlcontext.TaskQuery{Kind: v.Get("kind"), Queue: v.Get("queue")}, per, since)
	if err != nil {
		readError(w, err)
		return
	}
	writeJSON(w, map[string]any{"per": per, "since": since, "spans": spans})
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
	shown, err := s.annotate(ctx, append([]etlcontext.Task{t}, children...))
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
		"task": shown[0], "events_limit": eventsPage, "attempts_limit": attemptsPage, "children_limit": childrenPage,
		"args": args, "checkpoint": checkpoint, "log_here": s.logHere(t),
	}, events, attempts, shown[1:], maxResponse)
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
// can read it: the host that ran its latest attempt, by its identity or,
// after a reboot, by its name.
func (s *Server) logHere(t etlcontext.Task) bool {
	return t.LogPath != nil && ((t.HostID != nil && *t.HostID == s.hostID) || (t.Host != nil && *t.Host == s.host))
}

// log returns up to maxLogChunk bytes of the task's log from ?offset=, or
// its last maxLogChunk bytes without one; "next" is the offset to ask for
// next. The log file when the task ran on this host and the file is there
// ("source": "file", offsets in bytes), the tail the database keeps
// otherwise ("source": "database", offsets "<attempt>:<byte>").
func (s *Server) log(w http.ResponseWriter, r *http.Request) {
	t, err := s.oneTask(r)
	if err != nil {
		readError(w, err)
		return
	}
	if s.logHere(t) {
		if f, err := logdir.OpenLog(*t.LogPath, t.ID); err == nil {
			defer f.Close()
			s.fileLog(w, r, t, f)
			return
		}
	}
	s.keptLog(w, r, t)
}

func (s *Server) fileLog(w http.ResponseWriter, r *http.Request, t etlcontext.Task, f *os.File) {
	info, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("read the log of task %d: %w", t.ID, err))
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
		"offset":   strconv.FormatInt(offset, 10),
		"next":     strconv.FormatInt(offset+int64(n), 10),
		"finished": t.Status.Finished(),
		"source":   "file",
	})
}

// keptLog is log from the tail the database keeps: without an offset, the
// last maxLogChunk bytes of the latest attempt's; a gap (output not kept)
// is said in the text.
func (s *Server) keptLog(w http.ResponseWriter, r *http.Request, t etlcontext.Task) {
	ctx := r.Context()
	pos, ok := parseLogPos(r.URL.Query().Get("offset"))
	if !ok {
		end, err := etlcontext.LogEnd(ctx, s.pool, t.ID)
		if err != nil {
			readError(w, err)
			return
		}
		pos = etlcontext.LogPos{Attempt: end.Attempt, Offset: max(end.Offset-maxLogChunk, 0)}
	}
	pieces, err := etlcontext.LogSince(ctx, s.pool, t.ID, pos, maxLogChunk)
	if err != nil {
		readError(w, err)
		return
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
	writeJSON(w, map[string]any{
		"data":     text.String(),
		"offset":   formatLogPos(pos),
		"next":     formatLogPos(next),
		"finished": t.Status.Finished(),
		"source":   "database",
	})
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
