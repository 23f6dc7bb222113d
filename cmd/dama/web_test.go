package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/cmd/dama/internal/web"
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

// A task with 40 events of 200 KiB and as large a progress (8 MiB whole)
// reads back, in the page's reads, within about 1 MiB: each payload cut to
// its head with its size, the whole of one fetched on its own. With a read
// token set, reads need it. (Of 900 KiB each, the database's work to cut
// them, 0.37 s on an idle machine, passed the page's 10 s read timeout in
// a --slow run.)
func TestWebReadsAreBoundedInBytes(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(webConfig)
	res := env.Dama(cfg, "submit", "parked")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	big := map[string]string{"blob": strings.Repeat("x", 200<<10)}
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
		began := time.Now()
		code, body := read(path, withToken)
		took := time.Since(began)
		switch {
		case code != http.StatusOK:
			// A 503 after the page's read timeout is the machine's pace, not
			// a bound broken: say how long it took.
			t.Errorf("GET %s: %d after %s (the page's reads time out at 10 s): %.200q; want 200", path, code, took.Round(time.Millisecond), body)
		case len(body) > 1<<20+64<<10:
			t.Errorf("GET %s: %d bytes; want at most about 1 MiB", path, len(body))
		}
		if !strings.Contains(string(body), `"dama_truncated"`) {
			t.Errorf("GET %s: no payload marked cut short", path)
		}
		t.Logf("GET %s: %d bytes in %s", path, len(body), took.Round(time.Millisecond))
	}
	code, body := read(fmt.Sprintf("/api/tasks/%d/events/%d", id, last), withToken)
	var whole etlcontext.Event
	if err := json.Unmarshal(body, &whole); code != http.StatusOK || err != nil || len(whole.Payload) < 200<<10 {
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
