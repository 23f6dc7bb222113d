package testenv

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// These tests run on private servers: they need no TEST_DATABASE_URL.

func TestServerListensOnLoopbackAndSocket(t *testing.T) {
	srv := NewServer(t)
	ctx := context.Background()
	tcp := connect(t, srv.URL(), "dama-tcp")
	var listen, maxConns, fsync, serverAddr string
	if err := tcp.QueryRow(ctx, `SELECT current_setting('listen_addresses'), current_setting('max_connections'),
		current_setting('fsync'), host(inet_server_addr())`).Scan(&listen, &maxConns, &fsync, &serverAddr); err != nil {
		t.Fatal(err)
	}
	if listen != "127.0.0.1" || maxConns != "200" || fsync != "off" || serverAddr != "127.0.0.1" {
		t.Fatalf("listen_addresses=%q max_connections=%s fsync=%s server address %s; want 127.0.0.1, 200, off, 127.0.0.1",
			listen, maxConns, fsync, serverAddr)
	}
	sock := connect(t, srv.SocketURL(), "dama-socket")
	var port *int
	if err := sock.QueryRow(ctx, "SELECT inet_client_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if port != nil {
		t.Fatalf("SocketURL connected over TCP (client port %d)", *port)
	}

	srv.Stop(t, "immediate")
	if c, err := pgx.Connect(ctx, srv.URL()); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	srv.Start(t)
	connect(t, srv.URL(), "dama-after-start")
}

func TestSilenceTimesOutWithoutReset(t *testing.T) {
	srv := NewServer(t)
	ctx := context.Background()
	conn := connect(t, srv.URL(), "dama-silenced")
	observer := connect(t, srv.URL(), "dama-observer")
	var port int
	if err := conn.QueryRow(ctx, "SELECT inet_client_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if local := conn.PgConn().Conn().LocalAddr().(*net.TCPAddr).Port; local != port {
		t.Fatalf("server sees client port %d, client has %d", port, local)
	}
	restore := Silence(t, port)

	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := conn.Exec(qctx, "SELECT 1")
	elapsed := time.Since(start)
	t.Logf("query on the silenced connection: %v after %s", err, elapsed.Round(time.Millisecond))
	if err == nil {
		t.Fatal("a query on a silenced connection succeeded")
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || strings.Contains(err.Error(), "reset") {
		t.Fatalf("the silenced connection was reset: %v", err)
	}
	if !pgconn.Timeout(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a timeout of the 2s deadline, got %v", err)
	}
	if elapsed < 1900*time.Millisecond {
		t.Fatalf("the query failed after %s, before its 2s deadline: %v", elapsed, err)
	}

	// Only that connection is dark, and the server saw nothing: its
	// backend still waits for the client.
	octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
	defer ocancel()
	var n int
	if err := observer.QueryRow(octx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dama-silenced'").Scan(&n); err != nil {
		t.Fatalf("observer connection during the silence: %v", err)
	}
	if n != 1 {
		t.Fatalf("%d backends of the silenced connection; want 1 still waiting", n)
	}

	// Once restored, the client's retransmitted close reaches the server.
	restore()
	// Each look has a deadline of its own: octx may have run out on a slow
	// machine, and with it every look of the wait (a --slow run did).
	Eventually(t, 30*time.Second, "the closed connection's backend to end once restored", func() (bool, error) {
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		defer lcancel()
		err := observer.QueryRow(lctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dama-silenced'").Scan(&n)
		return err == nil && n == 0, err
	})
}

func TestSilenceConnectionKeepaliveEndsBackend(t *testing.T) {
	srv := NewServer(t)
	ctx := context.Background()
	conn := connect(t, srv.URL(), "dama-keepalive")
	// Over the socket: no TCP fault reaches the observer.
	observer := connect(t, srv.SocketURL(), "dama-observer")
	for _, set := range []string{
		"SET tcp_keepalives_idle = 1",
		"SET tcp_keepalives_interval = 1",
		"SET tcp_keepalives_count = 2",
		"SET tcp_user_timeout = 3000",
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatalf("%s: %v", set, err)
		}
	}
	pid, _ := SilenceConnection(t, observer, "dama-keepalive")
	silencedAt := time.Now()
	if want := int(conn.PgConn().PID()); pid != want {
		t.Fatalf("SilenceConnection returned backend %d, the connection's is %d", pid, want)
	}

	Eventually(t, 15*time.Second, "the server to end the silenced backend", func() (bool, error) {
		var n int
		err := observer.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0, err
	})
	t.Logf("backend %d ended %s after the silence", pid, time.Since(silencedAt).Round(time.Millisecond))
	// The kernel gave up on the peer (keepalive, user timeout): no reset
	// reached the server.
	if log := srv.Log(); !strings.Contains(log, "could not receive data from client: Connection timed out") {
		t.Fatalf("server log does not show the connection timing out:\n%s", tail(log, 4<<10))
	}
}

func TestRestartEndsConnectionsKeepsData(t *testing.T) {
	srv := NewServer(t)
	env := NewOn(t, srv)
	if env.Server != srv {
		t.Fatal("Env.Server is not the server it is on")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// NewOn migrated the database.
	if _, err := env.Pool.Exec(ctx, "SELECT count(*) FROM data_manager.etl_contexts"); err != nil {
		t.Fatalf("migrations not applied: %v", err)
	}
	if _, err := env.Pool.Exec(ctx, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	before := connect(t, env.URL, "dama-before")
	if _, err := before.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	srv.Restart(t, 500*time.Millisecond)

	// A minute from here: the restart may have taken most of the first on
	// a slow machine.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := before.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection made before the restart still works")
	} else {
		t.Logf("connection made before the restart: %v", err)
	}
	after := connect(t, env.URL, "dama-after")
	var x int
	if err := after.QueryRow(ctx, "SELECT x FROM kept").Scan(&x); err != nil || x != 42 {
		t.Fatalf("data after the restart: %d, %v; want 42", x, err)
	}
	// The pool drops its dead connections and recovers.
	Eventually(t, 10*time.Second, "the pool to work after the restart", func() (bool, error) {
		lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer lcancel()
		err := env.Pool.QueryRow(lctx, "SELECT x FROM kept").Scan(&x)
		return err == nil && x == 42, err
	})
}

func TestServerCleanupStopsAndRemoves(t *testing.T) {
	var dir string
	var pid string
	t.Run("server", func(t *testing.T) {
		srv := NewServer(t)
		dir = srv.dir
		b, err := os.ReadFile(filepath.Join(srv.dataDir(), "postmaster.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _, _ = strings.Cut(string(b), "\n")
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("server directory %s left behind: %v", dir, err)
	}
	Eventually(t, 10*time.Second, "the postmaster to be gone", func() (bool, error) {
		return !Alive(int(Atoi(t, pid))), nil
	})
}

// connect opens a connection named applicationName, closed when t ends.
func connect(t *testing.T, url, applicationName string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = applicationName
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect as %s: %v", applicationName, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn.Close(ctx)
	})
	return conn
}

// What the harness writes in a server's directories, it writes as the
// server's user: a link that user planted there (any superuser of a
// server it runs can) leads root nowhere.
func TestAServersFilesAreWrittenAsItsUser(t *testing.T) {
	srv := NewServer(t)
	if srv.runAs == "" {
		t.Skip("the server runs as this user: there is no other to plant a link")
	}
	target := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(target, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(srv.dir, "planted.conf")
	if out, err := srv.run("ln", "-s", target, planted); err != nil {
		t.Fatalf("plant a link as %s: %v: %s", srv.runAs, err, out)
	}
	if err := srv.writeFile(planted, "port = 1\n", true); err == nil {
		t.Error("writing through a link the server's user planted: no error")
	}
	if b, _ := os.ReadFile(target); string(b) != "root's\n" {
		t.Errorf("the file the link leads to holds %q", b)
	}
}
