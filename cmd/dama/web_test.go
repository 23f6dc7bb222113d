package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

const webConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
queues:
  etl: { max_running: 10 }
  held: { max_running: 10 }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
  fragile:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 1
  parked:
    queue: held
    command: ["{{sample}}"]
`

// webToken is the action token of the tests' pages.
const webToken = "test-token-0123456789"

var webURLRE = regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/`)

// startWeb starts `dama web` on a free port with args and returns it with
// its URL.
func startWeb(t *testing.T, env *testenv.Env, cfg string, extraEnv []string, args ...string) (*testenv.Proc, string) {
	t.Helper()
	p := env.StartWith(cfg, extraEnv, nil, append([]string{"web", "--listen", "127.0.0.1:0"}, args...)...)
	out := waitForLog(t, p, "serving the status page")
	return p, webURLRE.FindString(out)
}

// browser is a headless Chromium driven over the DevTools protocol.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// newBrowser starts Debian's Chromium, in a process group that the test's
// end kills. Without Chromium the test is skipped, unless
// DAMA_TEST_BROWSER=required (scripts/test.sh, which installs it).
func newBrowser(t *testing.T) *browser {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("DAMA_TEST_BROWSER") == "required" {
			t.Fatal("no chromium found, and DAMA_TEST_BROWSER=required")
		}
		t.Skip("no chromium found: scripts/test.sh installs it")
	}
	var pid int
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 720),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
			if cmd.SysProcAttr == nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{}
			}
			cmd.SysProcAttr.Setpgid = true
		}),
	)
	if os.Geteuid() == 0 {
		// Chromium's sandbox refuses to run as root.
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	// The first action starts the browser and must not have a deadline.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	if p := chromedp.FromContext(ctx).Browser.Process(); p != nil {
		pid = p.Pid
	}
	return &browser{t: t, ctx: ctx}
}

// do runs the steps, bounded by 30 seconds.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitJS waits until the expression is truthy in the page.
func (b *browser) waitJS(what, expr string, timeout time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		page := eval[string](b, "document.body.innerText")
		b.t.Fatalf("wait for %s (%s): %v\npage:\n%s", what, expr, err, page)
	}
}

// screenshot saves the page to name in $DAMA_SCREENSHOT_DIR, or in the
// test's directory.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("DAMA_SCREENSHOT_DIR")
	if dir == "" {
		dir = b.t.TempDir()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// TestWebPageInABrowser: in a real browser, the status page shows a
// running task's bar move, refuses an action without the token and one
// from another site, cancels a task, retries it, and pauses and resumes a
// queue, each recorded with who did it.
func TestWebPageInABrowser(t *testing.T) {
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	w := &world{Env: env}
	env.Start(cfg, "supervisor")
	submit := func(kind, args, key string) int64 {
		t.Helper()
		argv := []string{"submit", kind, "--args", args}
		if key != "" {
			argv = append(argv, "--idempotency-key", key)
		}
		res := env.Dama(cfg, argv...)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	failed := submit("fragile", sampleArgs(t, 3, 50, map[string]any{"fail_at": 2}), "")
	done := submit("sample", sampleArgs(t, 3, 50, nil), "")
	mover := submit("sample", sampleArgs(t, 80, 250, nil), "nightly-load-2026-11-22")
	victim := submit("sample", sampleArgs(t, 600, 100, nil), "")
	bystander := submit("sample", sampleArgs(t, 600, 100, nil), "")
	web, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken})
	for _, id := range []int64{failed, done} {
		w.waitFor(id, 30*time.Second, "to finish", func(t etlcontext.Task) bool { return t.Status.Finished() })
	}
	for _, id := range []int64{mover, victim, bystander} {
		w.waitRunning(id)
	}

	b := newBrowser(t)

	// The list shows the mover's bar, and then the bar moves, without a
	// reload.
	b.do("open the task list", chromedp.Navigate(base))
	bar := fmt.Sprintf(`document.querySelector('#tasks tr[data-id="%d"] progress')`, mover)
	b.waitJS("the mover's bar", bar+" && "+bar+".value > 0", 30*time.Second)
	first := eval[float64](b, bar+".value")
	b.waitJS("the mover's bar to move", fmt.Sprintf("%s.value > %v", bar, first), 30*time.Second)
	moved := eval[float64](b, bar+".value")
	t.Logf("the bar of task %d moved from %.3f to %.3f", mover, first, moved)
	row := fmt.Sprintf(`document.querySelector('#tasks tr[data-id="%d"]')`, failed)
	b.waitJS("the FAILED task's row", row+" && "+row+`.dataset.status === "FAILED"`, 10*time.Second)
	b.screenshot("tasks.png")

	// The search finds a task by its idempotency key.
	b.do("search by key", chromedp.SendKeys(`#filters [name=q]`, "nightly-load-2026-11-22"))
	b.waitJS("the search's one row", fmt.Sprintf(`document.querySelectorAll('#tasks tbody tr').length === 1 && document.querySelector('#tasks tbody tr').dataset.id === "%d"`, mover), 10*time.Second)

	// Cancel without the token: refused, and the task runs on.
	b.do("open the victim's page", chromedp.Navigate(fmt.Sprintf("%stasks/%d", base, victim)))
	b.waitJS("the victim's page", `document.querySelector('#summary p') && document.querySelector('#summary p').dataset.status === "RUNNING"`, 10*time.Second)
	b.do("cancel without the token", chromedp.Click(`#actions [data-action$="/cancel"]`))
	b.waitJS("the refusal", `document.querySelector('#error').textContent.includes("a valid token is needed")`, 10*time.Second)
	if got := w.task(victim); got.Status != etlcontext.StatusRunning || got.CancelRequestedAt != nil {
		t.Fatalf("after a refused cancel, task %d is %s with cancel requested at %v: want RUNNING, not requested", victim, got.Status, got.CancelRequestedAt)
	}

	// From another site (another port of this host: "same-site"), a form
	// posted to the cancel action is refused before the token is looked
	// at; the page cannot add the header without a preflight, which the
	// page's server never grants.
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(rw, `<form method="post" action="%sapi/tasks/%d/cancel"><input name="reason" value="x"></form>
<script>
fetch(%q, {method: "POST", headers: {"X-Dama-Token": "guess"}}).catch(() => { document.title = "preflight refused"; });
document.forms[0].submit();
</script>`, base, bystander, fmt.Sprintf("%sapi/tasks/%d/cancel", base, bystander))
	}))
	defer evil.Close()
	b.do("open the other site", chromedp.Navigate(evil.URL))
	waitForLog(t, web, "cross-site request refused (Sec-Fetch-Site: same-site)")
	if got := w.task(bystander); got.Status != etlcontext.StatusRunning || got.CancelRequestedAt != nil {
		t.Fatalf("after a cross-site cancel, task %d is %s with cancel requested at %v: want RUNNING, not requested", bystander, got.Status, got.CancelRequestedAt)
	}

	// With the token: cancelled, and recorded as done by the name given.
	b.do("open the victim's page again", chromedp.Navigate(fmt.Sprintf("%stasks/%d", base, victim)))
	b.do("give the token and a name",
		chromedp.SendKeys("#token", webToken),
		chromedp.SendKeys("#actor", "alice"),
		chromedp.Click(`#actions [data-action$="/cancel"]`))
	b.waitJS("the victim CANCELLED", `document.querySelector('#summary p').dataset.status === "CANCELLED"`, 30*time.Second)
	w.waitFor(victim, 30*time.Second, "CANCELLED with its lock free", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusCancelled && !t.InitialEventLocked
	})
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	wantActor := "alice via dama web on " + host + " from 127.0.0.1"
	if by := eventBy(t, env, victim, etlcontext.EventCancelRequested); by != wantActor {
		t.Errorf("CANCEL_REQUESTED of task %d by %q, want %q", victim, by, wantActor)
	}
	b.screenshot("task.png")

	// Retry it from the page: it runs again.
	b.do("retry", chromedp.Click(`#actions [data-action$="/retry"]`))
	w.waitFor(victim, 30*time.Second, "to run again", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.Attempt == 2
	})
	if by := eventBy(t, env, victim, etlcontext.EventRetried); by != wantActor {
		t.Errorf("RETRIED of task %d by %q, want %q", victim, by, wantActor)
	}

	// Pause and resume a queue from the queues page (the token is kept by
	// the tab).
	b.do("open the queues page", chromedp.Navigate(base+"queues"))
	pause := `#queue-controls tr[data-name="held"] button`
	b.waitJS("the held queue's button", `document.querySelector('`+pause+`')`, 10*time.Second)
	b.do("pause held", chromedp.SendKeys("#reason", "disk full"), chromedp.Click(pause))
	b.waitJS("held paused", `document.querySelector('#queue-controls tr[data-name="held"]').textContent.includes("paused: disk full")`, 10*time.Second)
	b.waitJS("the pause in the history", `document.querySelector('#history tbody').textContent.includes("PAUSED")`, 10*time.Second)
	b.screenshot("queues.png")
	b.do("resume held", chromedp.Click(pause))
	b.waitJS("held resumed", `document.querySelector('#history tbody').textContent.includes("RESUMED")`, 10*time.Second)
	history, err := etlcontext.ControlEvents(context.Background(), env.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range history {
		got = append(got, h.Action+" "+h.Queue+" "+h.Reason+" by "+h.Actor)
	}
	want := []string{"RESUMED held  by " + wantActor, "PAUSED held disk full by " + wantActor}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("control events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// eventBy returns the "by" of the newest event of the given suffix.
func eventBy(t *testing.T, env *testenv.Env, id int64, suffix string) string {
	t.Helper()
	payload, err := etlcontext.LatestPayload(context.Background(), env.Pool, id, suffix)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		By string `json:"by"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatalf("%s event of task %d: %v (%s)", suffix, id, err, payload)
	}
	return p.By
}

// call makes a request to the page's server and returns the status and
// the decoded JSON body.
func call(t *testing.T, method, url string, header map[string]string, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s %s: %s: not JSON: %s", method, url, resp.Status, b)
	}
	return resp.StatusCode, v
}

// TestWebAPI: the page's API filters the tasks, shows a task's attempts
// with their errors and log tails and its log, and guards its actions:
// the token, the requesting site, the Host (against DNS rebinding), and
// --read-only; a token too short is refused at start.
func TestWebAPI(t *testing.T) {
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
	_, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken})
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
	} {
		code, v := call(t, "GET", base+"api/tasks"+c.query, nil, "")
		if got := ids(v); code != http.StatusOK || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("GET api/tasks%s: %d %v, want 200 %v", c.query, code, got, c.want)
		}
	}
	if code, v := call(t, "GET", base+"api/tasks?status=LOST", nil, ""); code != http.StatusBadRequest {
		t.Errorf("GET api/tasks?status=LOST: %d %v, want 400", code, v)
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
	// A script with the token (no browser, so no Sec-Fetch-Site) acts.
	code, v = call(t, "POST", resume, map[string]string{"X-Dama-Token": webToken, "X-Dama-Actor": "\tci-job\t"}, "")
	if code != http.StatusOK || v["resumed"] != true || w.queuePaused("held") {
		t.Fatalf("resume with the token: %d %v", code, v)
	}
	code, v = call(t, "POST", base+"api/queues/nosuch/pause", map[string]string{"X-Dama-Token": webToken}, `{"reason":"x"}`)
	if code != http.StatusNotFound {
		t.Errorf("pause an unknown queue: %d %v, want 404", code, v)
	}
	code, v = call(t, "POST", base+"api/kinds/parked/block", map[string]string{"X-Dama-Token": webToken}, `{"reason":""}`)
	if code != http.StatusConflict || !strings.Contains(fmt.Sprint(v["error"]), "reason is required") {
		t.Errorf("block without a reason: %d %v, want 409 and the reason", code, v)
	}
	history, err := etlcontext.ControlEvents(context.Background(), env.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(history) != 2 || history[0].Action != "RESUMED" || !strings.HasPrefix(history[0].Actor, "ci-job via dama web on ") ||
		history[1].Action != "PAUSED" || !strings.Contains(history[1].Actor, "@") {
		t.Errorf("control events %+v: want RESUMED by ci-job (the control characters dropped) after PAUSED by user@host (dama pause)", history)
	}

	// Read-only: the same request is refused, and the page offers none.
	_, ro := startWeb(t, env, cfg, nil, "--read-only")
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
