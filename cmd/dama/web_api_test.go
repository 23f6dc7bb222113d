package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// TestWebAPI: the page's API filters the tasks, shows a task's attempts
// with their errors and log tails and its log, and guards its actions:
// the token, the requesting site, the Host (against DNS rebinding), and
// --read-only; a token too short is refused at start.
func TestWebAPI(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	w := &world{Env: env}
	env.Start(cfg, "supervisor")
	submit := func(kind, args string) int64 {
		t.Helper()
		res := env.Dama(cfg, "submit", kind, "--args", args)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	failed := submit("fragile", sampleArgs(t, 3, 50, map[string]any{"fail_at": 2}))
	done := submit("sample", sampleArgs(t, 3, 50, nil))
	if res := env.Dama(cfg, "pause", "held"); res.Code != 0 {
		t.Fatalf("pause: %s", res.Stderr)
	}
	parked := submit("parked", "{}")
	for _, id := range []int64{failed, done} {
		w.waitFor(id, 30*time.Second, "to finish", func(t etlcontext.Task) bool { return t.Status.Finished() })
	}
	_, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken}, "--public-reads")
	ids := func(v map[string]any) []int64 {
		var out []int64
		for _, x := range v["tasks"].([]any) {
			out = append(out, int64(x.(map[string]any)["etl_context_id"].(float64)))
		}
		return out
	}
	for _, c := range []struct {
		query string
		want  []int64
	}{
		{"", []int64{parked, done, failed}},
		{"?kind=fragile", []int64{failed}},
		{"?queue=held", []int64{parked}},
		{"?status=done,failed", []int64{done, failed}},
		{"?queue=etl&status=QUEUED", nil},
		{"?q=" + strconv.FormatInt(done, 10), []int64{done}},
		{"?before=" + strconv.FormatInt(parked, 10), []int64{done, failed}},
		{"?status=failed&before=" + strconv.FormatInt(failed, 10), nil},
	} {
		code, v := call(t, "GET", base+"api/tasks"+c.query, nil, "")
		if got := ids(v); code != http.StatusOK || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("GET api/tasks%s: %d %v, want 200 %v", c.query, code, got, c.want)
		}
	}
	// Another site's page (a script, an image) reads nothing, even of a
	// page with public reads.
	for _, site := range []string{"cross-site", "same-site"} {
		if code, v := call(t, "GET", base+"api/tasks", map[string]string{"Sec-Fetch-Site": site}, ""); code != http.StatusForbidden {
			t.Errorf("GET api/tasks from %s: %d %v, want 403", site, code, v)
		}
	}
	for _, query := range []string{"tasks?status=LOST", "tasks?before=x", "tasks?before=-1", "finished?per=week"} {
		if code, v := call(t, "GET", base+"api/"+query, nil, ""); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(v["error"]), "invalid request") {
			t.Errorf("GET api/%s: %d %v, want 400", query, code, v)
		}
	}
	// The counts by status, the failed task's reason, the chart's spans.
	_, v := call(t, "GET", base+"api/tasks", nil, "")
	if counts := fmt.Sprint(v["counts"]); counts != "map[CANCELLED:0 DONE:1 FAILED:1 QUEUED:1 RETRYING:0 RUNNING:0]" {
		t.Errorf("GET api/tasks: counts %s, want 1 QUEUED, 1 DONE, 1 FAILED", counts)
	}
	for _, x := range v["tasks"].([]any) {
		task := x.(map[string]any)
		reason := fmt.Sprint(task["reason"])
		switch int64(task["etl_context_id"].(float64)) {
		case failed:
			if !strings.Contains(reason, "exit 3: failing at step 2 as asked") {
				t.Errorf("the failed task's reason: %s", reason)
			}
		case parked:
			if !strings.Contains(reason, "waiting: its queue is paused") || !strings.Contains(reason, "since:") {
				t.Errorf("the parked task's reason: %s, want its wait and since when", reason)
			}
		}
	}
	_, v = call(t, "GET", base+"api/finished?per=minute&kind=fragile", nil, "")
	if spans := fmt.Sprint(v["spans"]); !strings.Contains(spans, "done:0 failed:1") || strings.Count(spans, "at:") != 1 {
		t.Errorf("GET api/finished: %s, want one span with the FAILED task", spans)
	}

	// A task's attempts, with the failure's reason, exit code and log tail.
	code, v := call(t, "GET", fmt.Sprintf("%sapi/tasks/%d", base, failed), nil, "")
	if code != http.StatusOK {
		t.Fatalf("GET task %d: %d %v", failed, code, v)
	}
	attempts := v["attempts"].([]any)
	if len(attempts) != 1 {
		t.Fatalf("task %d has %d attempts, want 1: %v", failed, len(attempts), attempts)
	}
	a := attempts[0].(map[string]any)
	if a["outcome"] != "FAILED" || a["exit_code"] != float64(3) || !strings.Contains(fmt.Sprint(a["log_tail"]), "failing at step 2") {
		t.Errorf("attempt of task %d: %v, want FAILED, exit 3, and the log's tail", failed, a)
	}
	// Its ERROR event is said in a line, its log's tail counted, not quoted.
	var summaries []string
	for _, e := range v["events"].([]any) {
		if s, ok := e.(map[string]any)["summary"].(string); ok {
			summaries = append(summaries, s)
		}
	}
	if len(summaries) != 1 || !regexp.MustCompile(`^exit 3: failing at step 2 as asked \(and the log's last \d+ lines\)$`).MatchString(summaries[0]) {
		t.Errorf("the events' summaries of task %d: %q, want its ERROR's", failed, summaries)
	}
	if v["log_here"] != true {
		t.Errorf("task %d ran on this host, but log_here is %v", failed, v["log_here"])
	}
	code, v = call(t, "GET", fmt.Sprintf("%sapi/tasks/%d/log", base, failed), nil, "")
	if code != http.StatusOK || !strings.Contains(fmt.Sprint(v["data"]), "failing at step 2") {
		t.Errorf("GET task %d's log: %d %v", failed, code, v)
	}
	if code, _ := call(t, "GET", base+"api/tasks/999999", nil, ""); code != http.StatusNotFound {
		t.Errorf("GET a task that does not exist: %d, want 404", code)
	}
	if code, _ := call(t, "GET", base+"api/tasks/abc", nil, ""); code != http.StatusBadRequest {
		t.Errorf("GET task abc: %d, want 400", code)
	}
	// A log on another host is not read from this one's disk, but from
	// the tail the database keeps.
	if _, err := env.Pool.Exec(context.Background(), `UPDATE data_manager.etl_contexts SET host_id = 'elsewhere', host = 'elsewhere' WHERE etl_context_id = $1`, done); err != nil {
		t.Fatal(err)
	}
	if code, v := call(t, "GET", fmt.Sprintf("%sapi/tasks/%d/log", base, done), nil, ""); code != http.StatusOK || v["source"] != "database" || !strings.Contains(fmt.Sprint(v["data"]), "done") {
		t.Errorf("GET the log of a task of another host: %d %v, want 200 from the database with its output", code, v)
	}
	// A log a task replaced with a link is not followed: anyone who
	// reaches the page would read what it points to.
	failedTask := w.task(failed)
	secret := filepath.Join(env.Dir, "secret")
	if err := os.WriteFile(secret, []byte("the database password"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(*failedTask.LogPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, *failedTask.LogPath); err != nil {
		t.Fatal(err)
	}
	if code, v := call(t, "GET", fmt.Sprintf("%sapi/tasks/%d/log", base, failed), nil, ""); code != http.StatusOK || v["source"] != "database" || strings.Contains(fmt.Sprint(v), "password") {
		t.Errorf("GET a log replaced by a link: %d %v, want the tail the database keeps, and not what the link points to", code, v)
	}

	// The guards. Each refused request leaves the queue paused.
	resume := base + "api/queues/held/resume"
	for _, c := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"a wrong token", map[string]string{"X-Dama-Token": webToken + "x"}, http.StatusUnauthorized},
		{"another site", map[string]string{"X-Dama-Token": webToken, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"a rebound name", map[string]string{"X-Dama-Token": webToken, "Host": "attacker.example:80"}, http.StatusMisdirectedRequest},
	} {
		if code, v := call(t, "POST", resume, c.header, ""); code != c.want {
			t.Errorf("resume with %s: %d %v, want %d", c.name, code, v, c.want)
		}
		if paused := w.queuePaused("held"); !paused {
			t.Fatalf("resume with %s resumed the queue", c.name)
		}
	}
	if code, _ := call(t, "GET", base+"api/tasks", map[string]string{"Host": "attacker.example"}, ""); code != http.StatusMisdirectedRequest {
		t.Errorf("read with a rebound name: %d, want 421", code)
	}
	// A preflight is answered without any CORS grant.
	req, err := http.NewRequest("OPTIONS", resume, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", "http://attacker.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "x-dama-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for k := range resp.Header {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("preflight answered with %s: %v", k, resp.Header[k])
		}
	}

	// A script with the token (no browser, so no Sec-Fetch-Site) acts, and
	// is recorded by the name it gives, its control characters dropped.
	ci := map[string]string{"X-Dama-Token": webToken, "X-Dama-Actor": "ci\tjob"}
	wantActor := `"cijob" via dama web on `
	code, v = call(t, "POST", fmt.Sprintf("%sapi/tasks/%d/cancel", base, parked), ci, "")
	if code != http.StatusOK || v["status"] != "CANCELLED" {
		t.Fatalf("cancel the parked task: %d %v, want CANCELLED at once", code, v)
	}
	if by := eventBy(t, env, parked, protocol.EventCancelled); !strings.HasPrefix(by, wantActor) {
		t.Errorf("CANCELLED of the parked task by %q, want %s...", by, wantActor)
	}
	if code, v = call(t, "POST", fmt.Sprintf("%sapi/tasks/%d/cancel", base, done), ci, ""); code != http.StatusConflict {
		t.Errorf("cancel a DONE task: %d %v, want 409", code, v)
	}
	code, v = call(t, "POST", resume, ci, "")
	if code != http.StatusOK || v["resumed"] != true || w.queuePaused("held") {
		t.Fatalf("resume with the token: %d %v", code, v)
	}
	for _, action := range []string{"block", "unblock"} {
		if code, v := call(t, "POST", base+"api/kinds/parked/"+action, ci, `{"reason":"bad input"}`); code != http.StatusOK {
			t.Fatalf("%s parked: %d %v", action, code, v)
		}
	}
	code, v = call(t, "POST", base+"api/queues/nosuch/pause", map[string]string{"X-Dama-Token": webToken}, `{"reason":"x"}`)
	if code != http.StatusNotFound {
		t.Errorf("pause an unknown queue: %d %v, want 404", code, v)
	}
	code, v = call(t, "POST", base+"api/kinds/parked/block", map[string]string{"X-Dama-Token": webToken}, `{"reason":" "}`)
	if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(v["error"]), "needs a reason") {
		t.Errorf("block without a reason: %d %v, want 400 and why", code, v)
	}
	history, err := etlcontext.ControlEvents(context.Background(), env.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range history {
		actor := h.Actor
		if strings.HasPrefix(actor, wantActor) {
			actor = "cijob"
		} else if strings.Contains(actor, "@") {
			actor = "user@host"
		}
		got = append(got, h.Action+" "+h.Queue+h.Kind+" "+actor)
	}
	if want := "UNBLOCKED parked cijob, BLOCKED parked cijob, RESUMED held cijob, PAUSED held user@host"; strings.Join(got, ", ") != want {
		t.Errorf("control events: %s\nwant: %s", strings.Join(got, ", "), want)
	}
	if _, err := env.Pool.Exec(context.Background(), `DELETE FROM data_manager.control_events`); err == nil {
		t.Error("control_events rows could be deleted")
	}

	// Read-only: the same request is refused, and the page offers none.
	_, ro := startWeb(t, env, cfg, nil, "--read-only", "--public-reads")
	if code, v := call(t, "POST", ro+"api/queues/held/pause", map[string]string{"X-Dama-Token": webToken}, ""); code != http.StatusForbidden {
		t.Errorf("pause on a read-only page: %d %v, want 403", code, v)
	}
	if _, v := call(t, "GET", ro+"api/config", nil, ""); v["read_only"] != true {
		t.Errorf("read-only page's config: %v", v)
	}

	// A short token is refused in one line, before anything listens.
	for _, token := range []string{"", "short"} {
		res := env.DamaWith(cfg, []string{webTokenEnv + "=" + token}, "web", "--listen", "127.0.0.1:0")
		if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || !strings.Contains(res.Stderr, "DAMA_WEB_TOKEN") {
			t.Errorf("dama web with token %q: exit %d, stderr %q: want one line naming DAMA_WEB_TOKEN", token, res.Code, res.Stderr)
		}
	}
}

// queuePaused reads whether queue is paused.
func (w *world) queuePaused(queue string) bool {
	w.T.Helper()
	stats, err := etlcontext.QueueStats(context.Background(), w.Pool)
	if err != nil {
		w.T.Fatal(err)
	}
	for _, s := range stats {
		if s.Queue != nil && *s.Queue == queue && s.Paused {
			return true
		}
	}
	return false
}
