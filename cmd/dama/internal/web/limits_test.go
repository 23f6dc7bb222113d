package web_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/cmd/dama/internal/web"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// serve starts the page over a test database, with metrics as its
// /metrics handler (a read like any other), and returns its address.
func serve(t *testing.T, metrics http.Handler) string {
	t.Helper()
	env := testenv.New(t)
	cfg, err := config.Load(env.WriteConfig("log_dir: {{dir}}/logs\nkinds:\n  sample: { command: [\"true\"] }\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	page, err := web.New(env.Pool, cfg, web.Options{
		ReadOnly: true, AllowedHosts: []string{"localhost"}, Metrics: metrics, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = page
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// At most 8 reads run at once: a ninth waits for a slot, and gives up
// when its time is out.
func TestReadsRunAtMostEightAtOnce(t *testing.T) {
	entered, release := make(chan struct{}, 16), make(chan struct{})
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		fmt.Fprintln(w, "ok")
	}))
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	get := func() (int, string, error) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	type reply struct {
		code int
		body string
		err  error
	}
	first := make(chan reply, 8)
	for range 8 {
		go func() {
			code, body, err := get()
			first <- reply{code, body, err}
		}()
	}
	for i := range 8 {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of 8 reads under way after 30s", i)
		}
	}
	ninth := make(chan reply, 1)
	go func() {
		code, body, err := get()
		ninth <- reply{code, body, err}
	}()
	select {
	case r := <-ninth:
		if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "8 reads are under way") {
			t.Errorf("the ninth read: %d %q, %v; want 503, 8 reads are under way", r.code, r.body, r.err)
		}
	case <-entered:
		t.Error("a ninth read ran beside eight")
	case <-time.After(time.Minute):
		t.Fatal("the ninth read did not end within a minute")
	}
	close(release)
	released = true
	for range 8 {
		if r := <-first; r.code != http.StatusOK || r.err != nil {
			t.Errorf("a read once released: %d %q, %v", r.code, r.body, r.err)
		}
	}
}

// A client that does not read its reply holds no read's slot: the reply
// is made while the read holds its slot, and written after.
func TestClientsThatDoNotReadHoldNoReads(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 16<<20) // more than a socket's buffers
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("small") {
			fmt.Fprintln(w, "ok")
			return
		}
		_, _ = w.Write(big)
	}))
	// Eight clients that ask for a big reply and never read it, with a
	// receive buffer as small as the kernel allows.
	dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	for range 8 {
		conn, err := dialer.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
			t.Fatal(err)
		}
		// Its reply has begun: the read has run.
		if status, err := bufio.NewReaderSize(conn, 16).ReadString('\n'); err != nil || !strings.Contains(status, "200") {
			t.Fatalf("status %q, %v", status, err)
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics?small")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Errorf("a read beside eight clients that do not read: %d %q, want 200", resp.StatusCode, b)
	}
}
