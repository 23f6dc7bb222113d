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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dama-etl/dama/cmd/dama/internal/web"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/taskrunner/protocol"
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

// loginLink returns the login link the page p printed at its start.
func loginLink(t *testing.T, p *testenv.Proc) string {
	t.Helper()
	out := waitForLog(t, p, "/?token=")
	link := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/\?token=[A-Z2-7]+`).FindString(out)
	if link == "" {
		t.Fatalf("no login link in the page's output:\n%s", out)
	}
	return link
}

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
	var (
		mu  sync.Mutex
		cmd *exec.Cmd
	)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 720),
		chromedp.UserDataDir(t.TempDir()),
		// A process group of its own, to kill with all its helpers at the
		// end; and, as chromedp does without this option, killed with the
		// thread that started it.
		chromedp.ModifyCmdFunc(func(c *exec.Cmd) {
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			mu.Lock()
			cmd = c
			mu.Unlock()
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
		mu.Lock()
		defer mu.Unlock()
		if cmd != nil && cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	// The first action starts the browser and must not have a deadline.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", path, err)
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
	t.Parallel()
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
	victim := submit("sample", sampleArgs(t, 600, 100, map[string]any{"log_steps": true}), "")
	bystander := submit("sample", sampleArgs(t, 600, 100, nil), "")
	web, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken})
	login := loginLink(t, web)
	for _, id := range []int64{failed, done} {
		w.waitFor(id, 30*time.Second, "to finish", func(t etlcontext.Task) bool { return t.Status.Finished() })
	}
	for _, id := range []int64{mover, victim, bystander} {
		w.waitRunning(id)
	}

	b := newBrowser(t)

	// The list shows the mover's bar, and then the bar moves, without a
	// reload.
	// The login link printed at start logs the browser in (a cookie of
	// the page's) and lands on the task list.
	b.do("open the login link", chromedp.Navigate(login))
	b.waitJS("the task list, at the page's address without the token", fmt.Sprintf(`location.href === %q && document.querySelector('#tasks')`, base), 10*time.Second)
	bar := fmt.Sprintf(`document.querySelector('#tasks tr[data-id="%d"] progress')`, mover)
	b.waitJS("the mover's bar", bar+" && "+bar+".value > 0", 30*time.Second)
	first := eval[float64](b, bar+".value")
	b.waitJS("the mover's bar to move", fmt.Sprintf("%s.value > %v", bar, first), 30*time.Second)
	moved := eval[float64](b, bar+".value")
	t.Logf("the bar of task %d moved from %.3f to %.3f", mover, first, moved)
	row := fmt.Sprintf(`document.querySelector('#tasks tr[data-id="%d"]')`, failed)
	b.waitJS("the FAILED task's row", row+" && "+row+`.dataset.status === "FAILED"`, 10*time.Second)
	b.screenshot("web-tasks.png")

	// The search finds a task by its idempotency key.
	b.do("search by key", chromedp.SendKeys(`#filters [name=q]`, "nightly-load-2026-11-22"))
	b.waitJS("the search's one row", fmt.Sprintf(`document.querySelectorAll('#tasks tbody tr').length === 1 && document.querySelector('#tasks tbody tr').dataset.id === "%d"`, mover), 10*time.Second)

	// Cancel without the token: refused, and the task runs on.
	b.do("open the victim's page", chromedp.Navigate(fmt.Sprintf("%stasks/%d", base, victim)))
	b.waitJS("the victim's page", `document.querySelector('#summary p') && document.querySelector('#summary p').dataset.status === "RUNNING"`, 10*time.Second)
	// Its log is followed live: the page on the task's host adds the
	// lines the command writes.
	b.waitJS("the victim's log", `document.querySelector('#log').textContent.includes("step ")`, 10*time.Second)
	lines := eval[int](b, `document.querySelector('#log').textContent.split("\n").length`)
	b.waitJS("the victim's log to grow", fmt.Sprintf(`document.querySelector('#log').textContent.split("\n").length > %d + 5`, lines), 10*time.Second)
	b.do("cancel without the token", chromedp.Click(`#actions [data-action$="/cancel"]`))
	b.waitJS("the refusal", `document.querySelector('#done').textContent.includes("refused: a valid token is needed")`, 10*time.Second)
	if got := w.task(victim); got.Status != etlcontext.StatusRunning || got.CancelRequestedAt != nil {
		t.Fatalf("after a refused cancel, task %d is %s with cancel requested at %v: want RUNNING, not requested", victim, got.Status, got.CancelRequestedAt)
	}

	// From another site (another port of this host: "same-site"): a
	// script cannot send the token's header, for its preflight is not
	// granted; and a form posted to the cancel action is refused before
	// the token is looked at.
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(rw, `<title>other site</title><form method="post" action="%[1]s"><input name="reason" value="x"></form>
<script>
fetch(%[1]q, {method: "POST", headers: {"X-Dama-Token": "guess"}})
  .then(() => { document.title = "preflight granted"; }, () => { document.title = "preflight refused"; });
</script>`, fmt.Sprintf("%sapi/tasks/%d/cancel", base, bystander))
	}))
	defer evil.Close()
	b.do("open the other site", chromedp.Navigate(evil.URL))
	b.waitJS("the other site's fetch to end", `document.title !== "other site"`, 10*time.Second)
	if title := eval[string](b, "document.title"); title != "preflight refused" {
		t.Fatalf("a script of another site sending the token's header: %q, want its preflight refused", title)
	}
	b.do("post the other site's form", chromedp.Evaluate[chromedp.Void]("document.forms[0].submit()"))
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
	b.waitJS("the page to show the lock free", `document.querySelector('#summary p').textContent.includes("lock free")`, 10*time.Second)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var role string
	if err := env.Pool.QueryRow(context.Background(), `SELECT session_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	// Who acts: the name the page was given, and the database role.
	wantActor := `"alice" via dama web on ` + host + " from 127.0.0.1 (database role " + role + ")"
	if by := eventBy(t, env, victim, protocol.EventCancelRequested); by != wantActor {
		t.Errorf("CANCEL_REQUESTED of task %d by %q, want %q", victim, by, wantActor)
	}

	// Retry it from the page: it runs again.
	b.do("retry", chromedp.Click(`#actions [data-action$="/retry"]`))
	w.waitFor(victim, 30*time.Second, "to run again", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.Attempt == 2
	})
	if by := eventBy(t, env, victim, protocol.EventRetried); by != wantActor {
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
	b.screenshot("web-queues.png")
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

// TestHostsFor: the Host names a page answers to follow its address.
func TestHostsFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr  string
		extra []string
		want  string
	}{
		{"127.0.0.1:8080", nil, "[localhost]"},
		{"[::1]:8080", []string{"dama.internal"}, "[localhost dama.internal]"},
		{"10.1.2.3:8080", nil, "[10.1.2.3]"},
		{"0.0.0.0:8080", nil, "[]"},
		{"0.0.0.0:8080", []string{"dama.example.com"}, "[dama.example.com]"},
	} {
		if got := fmt.Sprint(hostsFor(c.addr, c.extra)); got != c.want {
			t.Errorf("hostsFor(%s, %v) = %s, want %s", c.addr, c.extra, got, c.want)
		}
	}
}

// A task with 40 events of 900 KB and as large a progress reads back, in
// the page's reads, within about 1 MiB: each payload cut to its head with
// its size, the whole of one fetched on its own. With a read token set,
// reads need it.
func TestWebReadsAreBoundedInBytes(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	res := env.Dama(cfg, "submit", "parked")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	big := map[string]string{"blob": strings.Repeat("x", 900<<10)}
	ctx := context.Background()
	var last int64
	for i := range 41 {
		typ := "parked:ROWS"
		if i == 40 {
			typ = "parked:PROGRESS"
		}
		eid, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: typ, Payload: big})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			last = eid
		}
	}
	const readToken = "read-token-0123456789"
	_, base := startWeb(t, env, cfg, []string{webReadTokenEnv + "=" + readToken}, "--read-only")
	read := func(path string, header map[string]string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	withToken := map[string]string{"X-Dama-Read-Token": readToken}
	for _, path := range []string{"/api/tasks", fmt.Sprintf("/api/tasks/%d", id), "/metrics"} {
		if code, _ := read(path, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the read token: %d, want 401", path, code)
		}
	}
	if code, _ := read("/metrics", map[string]string{"Authorization": "Bearer " + readToken}); code != http.StatusOK {
		t.Errorf("GET /metrics with the read token as a bearer: %d, want 200", code)
	}
	for _, path := range []string{"/api/tasks", fmt.Sprintf("/api/tasks/%d", id)} {
		code, body := read(path, withToken)
		if code != http.StatusOK || len(body) > 1<<20+64<<10 {
			t.Errorf("GET %s: %d, %d bytes; want 200 and at most about 1 MiB", path, code, len(body))
		}
		if !strings.Contains(string(body), `"dama_truncated"`) {
			t.Errorf("GET %s: no payload marked cut short", path)
		}
		t.Logf("GET %s: %d bytes", path, len(body))
	}
	code, body := read(fmt.Sprintf("/api/tasks/%d/events/%d", id, last), withToken)
	var whole etlcontext.Event
	if err := json.Unmarshal(body, &whole); code != http.StatusOK || err != nil || len(whole.Payload) < 900<<10 {
		t.Errorf("GET the whole event: %d, %d bytes of payload, %v; want it whole", code, len(whole.Payload), err)
	}
}

// `dama web` reads nothing to whoever reaches it: without a read token it
// makes one, and prints a login link once on its stderr, which sets an
// HttpOnly, SameSite=Lax cookie and sends the browser to the page without
// the token; API clients give it as a bearer; the action token reads too.
// --public-reads serves reads to anyone, as before.
func TestThePageReadsNothingWithoutItsToken(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	p, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken})
	link := loginLink(t, p)
	token := link[strings.Index(link, "=")+1:]
	if out, _ := os.ReadFile(p.Log); strings.Count(string(out), token) != 1 {
		t.Errorf("the token shows %d times in the page's output, want once (the link)", strings.Count(string(out), token))
	}
	get := func(url string, header map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		// The redirect is the test's to look at.
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, path := range []string{"api/tasks", "api/queues", "api/config", "metrics"} {
		if resp := get(base+path, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /%s without a token: %s, want 401", path, resp.Status)
		}
	}
	if resp := get(base+"?token=not-the-token-0123456789", nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a login link with another token: %s, cookies %v; want 401 and none", resp.Status, resp.Cookies())
	}
	resp := get(link, nil)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == web.LoginCookie {
			cookie = c
		}
	}
	switch {
	case resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/":
		t.Errorf("the login link: %s to %q, want 303 to /", resp.Status, resp.Header.Get("Location"))
	case cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode || cookie.Path != "/":
		t.Errorf("the login link's cookie: %+v; want HttpOnly, SameSite=Lax, on /", cookie)
	}
	if cookie == nil {
		t.FailNow()
	}
	// A login link sends the browser nowhere but this page.
	if resp := get(strings.Replace(link, "/?", "//evil.example/?", 1), nil); resp.Header.Get("Location") != "/evil.example/" {
		t.Errorf("a login link to //evil.example: Location %q, want this page's /evil.example/", resp.Header.Get("Location"))
	}
	// The action token logs no browser in: a cookie goes to every port
	// of the host.
	if resp := get(base+"?token="+webToken, nil); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a login link with the action token: %s, cookies %v; want 401 and none", resp.Status, resp.Cookies())
	}
	for name, header := range map[string]map[string]string{
		"the cookie": {"Cookie": web.LoginCookie + "=" + cookie.Value},
		// Another port's page set one of the name before it.
		"the cookie after another": {"Cookie": web.LoginCookie + "=x; " + web.LoginCookie + "=" + cookie.Value},
		"a bearer":                 {"Authorization": "Bearer " + token},
		"the action token":         {"X-Dama-Token": webToken},
	} {
		if resp := get(base+"api/tasks", header); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /api/tasks with %s: %s, want 200", name, resp.Status)
		}
	}
	// The cookie is no action token.
	if code, v := call(t, "POST", base+"api/queues/default/pause", map[string]string{"Cookie": web.LoginCookie + "=" + token}, ""); code != http.StatusForbidden && code != http.StatusUnauthorized {
		t.Errorf("pause with the login cookie alone: %d %v, want refused", code, v)
	}

	_, public := startWeb(t, env, cfg, nil, "--read-only", "--public-reads")
	if resp := get(public+"api/tasks", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/tasks of a page with --public-reads: %s, want 200", resp.Status)
	}
}
