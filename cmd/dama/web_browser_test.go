package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

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
		// Its singleton's socket and cookie go in a directory of $TMPDIR
		// that it never removes: the test's, which the test removes.
		chromedp.Env("TMPDIR="+t.TempDir()),
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
	deadline := time.Now().Add(timeout)
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return
		}
		// A navigation (the login link's redirect) destroys the document
		// the poll ran in: poll the new one.
		if navigated(err) && time.Now().Before(deadline) {
			continue
		}
		page := eval[string](b, "document.body.innerText")
		b.t.Fatalf("wait for %s (%s): %v\npage:\n%s", what, expr, err, page)
	}
}

// navigated reports an error of a poll whose document a navigation (a
// login link's redirect, a click on a link) destroyed meanwhile.
func navigated(err error) bool {
	return strings.Contains(err.Error(), "Cannot find context with specified id") ||
		strings.Contains(err.Error(), "Inspected target navigated or closed")
}

// click clicks the element selector names once it is there, finding and
// clicking it in one evaluation: the page redraws its tables as it
// refreshes, and a node found, then clicked, may be gone in between
// ("Could not find node with given id").
func (b *browser) click(what, selector string) {
	b.t.Helper()
	b.waitJS(what, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true; })()`, selector), 10*time.Second)
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

// colorScheme makes the page's system preference scheme: "dark" or
// "light".
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return chromedp.Void{}, err
	}
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
	// The running three run for as long as the test looks at them: the
	// mover's bar moves for 100 s, the victim logs a line a step until it
	// is cancelled, and the bystander waits after its step for a file
	// that never comes.
	hold := filepath.Join(env.Dir, "never")
	mover := submit("sample", sampleArgs(t, 400, 250, map[string]any{"until_file": hold}), "nightly-load-2026-11-22")
	victim := submit("sample", sampleArgs(t, 6000, 100, map[string]any{"log_steps": true, "until_file": hold}), "")
	bystander := submit("sample", sampleArgs(t, 1, 100, map[string]any{"until_file": hold}), "")
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
	// Its reason is its last error; the mover's time is what it has left;
	// the tabs count each status; the chart has the DONE and the FAILED.
	b.waitJS("the FAILED task's reason", row+`.querySelector('td.reason').textContent.includes("exit 3: failing at step 2")`, 10*time.Second)
	b.waitJS("the mover's time left", fmt.Sprintf(`/^ETA \d/.test(document.querySelector('#tasks tr[data-id="%d"] td:nth-child(8)').textContent)`, mover), 30*time.Second)
	b.waitJS("the tabs' counts", `['All 5', 'Running 3', 'Done 1', 'Failed 1', 'Queued 0'].every((want) => [...document.querySelectorAll('#tabs a')].some((a) => a.textContent.replace(/\s+/g, ' ') === want))`, 10*time.Second)
	b.waitJS("the chart's bars", `document.querySelector('#chart rect.done') && document.querySelector('#chart rect.failed')`, 10*time.Second)
	b.screenshot("web-tasks.png")
	b.do("dark mode", colorScheme("dark"))
	b.waitJS("the dark page", `getComputedStyle(document.body).backgroundColor !== "rgb(255, 255, 255)"`, 10*time.Second)
	b.screenshot("web-tasks-dark.png")
	b.do("light mode", colorScheme("light"))
	// The Failed tab lists the FAILED task alone, and says so in the
	// address.
	b.click("the Failed tab", `#tabs a[data-status="FAILED"]`)
	b.waitJS("the FAILED task alone", fmt.Sprintf(`location.search === "?status=FAILED" && document.querySelectorAll('#tasks tbody tr').length === 1 && document.querySelector('#tasks tbody tr').dataset.id === "%d"`, failed), 10*time.Second)
	b.do("back to every task", chromedp.Navigate(base))

	// The search finds a task by its idempotency key.
	b.do("search by key", chromedp.SendKeys(`#filters [name=q]`, "nightly-load-2026-11-22"))
	b.waitJS("the search's one row", fmt.Sprintf(`document.querySelectorAll('#tasks tbody tr').length === 1 && document.querySelector('#tasks tbody tr')?.dataset.id === "%d"`, mover), 10*time.Second)

	// Cancel without the token: refused, and the task runs on.
	b.do("open the victim's page", chromedp.Navigate(fmt.Sprintf("%stasks/%d", base, victim)))
	b.waitJS("the victim's page", `document.querySelector('#summary p')?.dataset.status === "RUNNING"`, 10*time.Second)
	// Its log is followed live: the page on the task's host adds the
	// lines the command writes.
	b.waitJS("the victim's log", `document.querySelector('#log')?.textContent.includes("step ")`, 10*time.Second)
	lines := eval[int](b, `document.querySelector('#log').textContent.split("\n").length`)
	b.waitJS("the victim's log to grow", fmt.Sprintf(`document.querySelector('#log')?.textContent.split("\n").length > %d + 5`, lines), 10*time.Second)
	b.screenshot("web-task.png")
	b.click("cancel without the token", `#actions [data-action$="/cancel"]`)
	b.waitJS("the refusal", `document.querySelector('#done')?.textContent.includes("refused: a valid token is needed")`, 10*time.Second)
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
		chromedp.SendKeys("#actor", "alice"))
	b.click("cancel", `#actions [data-action$="/cancel"]`)
	// The database first, at the machine's pace (a --slow run's cancel
	// took longer than the page's 30 s), then the page, which polls.
	w.waitFor(victim, 30*time.Second, "CANCELLED with its lock free", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusCancelled && !t.InitialEventLocked
	})
	b.waitJS("the victim CANCELLED", `document.querySelector('#summary p')?.dataset.status === "CANCELLED"`, 30*time.Second)
	b.waitJS("the page to show the lock free", `document.querySelector('#summary p')?.textContent.includes("lock free")`, 10*time.Second)
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
	b.click("retry", `#actions [data-action$="/retry"]`)
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
	// Who serves: the supervisor, and no banner saying nobody does.
	b.waitJS("the serving supervisor", `document.querySelector('#supervisors tbody')?.textContent.includes("SERVING") && document.querySelector('#unserved').hidden`, 10*time.Second)
	b.do("the pause's reason", chromedp.SendKeys("#reason", "disk full"))
	b.click("pause held", pause)
	b.waitJS("held paused", `document.querySelector('#queue-controls tr[data-name="held"]')?.textContent.includes("paused: disk full")`, 10*time.Second)
	b.waitJS("the pause in the history", `document.querySelector('#history tbody')?.textContent.includes("PAUSED")`, 10*time.Second)
	b.screenshot("web-queues.png")
	b.click("resume held", pause)
	b.waitJS("held resumed", `document.querySelector('#history tbody')?.textContent.includes("RESUMED")`, 10*time.Second)
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

// TestWebPagesAndBulkActions: in a real browser, the list pages past its
// newest 100 tasks with its filter kept in the address, and the tasks
// selected on a page are cancelled, then retried, at once, each recorded
// with who did it.
func TestWebPagesAndBulkActions(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	env.Start(cfg, "supervisor").WaitReady(t, time.Minute)
	if res := env.Dama(cfg, "pause", "held"); res.Code != 0 {
		t.Fatalf("dama pause held: exit %d: %s", res.Code, res.Stderr)
	}
	// 105 tasks that wait in the paused queue, submitted in one statement.
	var first int64
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT min(id) FROM (SELECT data_manager.submit('parked') AS id FROM generate_series(1, 105)) AS s`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	web, base := startWeb(t, env, cfg, []string{webTokenEnv + "=" + webToken})
	b := newBrowser(t)
	b.do("open the login link", chromedp.Navigate(loginLink(t, web)))
	b.click("the Queued tab", `#tabs a[data-status="QUEUED"]`)
	b.waitJS("the newest 100 of 105", `location.search === "?status=QUEUED" && document.querySelectorAll('#tasks tbody tr').length === 100 &&
		[...document.querySelectorAll('#tabs a')].some((a) => a.textContent.replace(/\s+/g, ' ') === 'Queued 105')`, 10*time.Second)
	b.click("older", "#older:not([hidden])")
	page2 := fmt.Sprintf("?status=QUEUED&before=%d", first+5)
	b.waitJS("the 5 oldest", fmt.Sprintf(`location.search === %q && document.querySelectorAll('#tasks tbody tr').length === 5 &&
		document.querySelector('#tasks tbody tr:last-child').dataset.id === "%d" && document.querySelector('#older').hidden`, page2, first), 10*time.Second)

	// Select the page's tasks and cancel them: one click.
	b.do("give the token and a name", chromedp.SendKeys("#token", webToken), chromedp.SendKeys("#actor", "bob"))
	b.click("select the page", "#pick-all")
	b.waitJS("5 selected", `document.querySelector('#picked').textContent === "5 selected" && !document.querySelector('#bulk').hidden`, 10*time.Second)
	b.click("cancel the selected", "#bulk-cancel")
	b.waitJS("the question", fmt.Sprintf(`document.querySelector('#done').textContent === "cancel tasks %d, %d, %d, %d, %d?" && document.querySelector('#bulk-yes').textContent === "Yes, cancel 5"`,
		first+4, first+3, first+2, first+1, first), 10*time.Second)
	b.screenshot("web-bulk.png")
	b.click("confirm", "#bulk-confirm:not([hidden]) #bulk-yes")
	b.waitJS("the cancels", `document.querySelector('#done').textContent === "cancel: 5 of 5 done"`, 30*time.Second)
	b.waitJS("the page emptied", `document.querySelectorAll('#tasks tbody tr').length === 0 && document.querySelector('#bulk').hidden`, 10*time.Second)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for id := first; id < first+5; id++ {
		if got := (&world{Env: env}).task(id); got.Status != etlcontext.StatusCancelled {
			t.Errorf("task %d after the bulk cancel: %s, want CANCELLED", id, got.Status)
		}
		if by := eventBy(t, env, id, protocol.EventCancelled); !strings.HasPrefix(by, `"bob" via dama web on `+host) {
			t.Errorf("task %d cancelled by %q, want bob via the page", id, by)
		}
	}
	if got := (&world{Env: env}).task(first + 5); got.Status != etlcontext.StatusQueued {
		t.Errorf("task %d, not selected, is %s after the bulk cancel: want QUEUED", first+5, got.Status)
	}

	// From the Cancelled tab, retry them all.
	b.click("the Cancelled tab", `#tabs a[data-status="CANCELLED"]`)
	b.waitJS("the 5 cancelled", `location.search === "?status=CANCELLED" && document.querySelectorAll('#tasks tbody tr').length === 5`, 10*time.Second)
	b.click("select the page", "#pick-all")
	b.click("retry the selected", "#bulk-retry")
	b.click("confirm", "#bulk-confirm:not([hidden]) #bulk-yes")
	b.waitJS("the retries", `document.querySelector('#done').textContent === "retry: 5 of 5 done"`, 30*time.Second)
	for id := first; id < first+5; id++ {
		if got := (&world{Env: env}).task(id); got.Status != etlcontext.StatusQueued {
			t.Errorf("task %d after the bulk retry: %s, want QUEUED", id, got.Status)
		}
	}
	b.do("back to the newest", chromedp.Navigate(base+page2))
	b.click("newest", "#newest:not([hidden])")
	b.waitJS("the newest page", `location.search === "?status=QUEUED" && document.querySelectorAll('#tasks tbody tr').length === 100`, 10*time.Second)
}
