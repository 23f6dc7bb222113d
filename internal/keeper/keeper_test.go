package keeper_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestMain(m *testing.M) {
	if addrs := os.Getenv(relayEnv); addrs != "" {
		relay(addrs)
		return
	}
	testenv.Main(m)
}

// secret is the keepers' and task processes' of these tests, as a
// supervisor would hand them.
var secret = []byte("a supervisor's random secret")

// serve runs a keeper for env's database until the test ends, and returns
// its socket.
func serve(t *testing.T, env *testenv.Env, configure ...func(*keeper.Config)) string {
	t.Helper()
	socket, done, cancel := start(t, env, configure...)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	})
	return socket
}

// start starts a keeper for env's database, and returns its socket, what
// Serve returns once it does, and what ends it.
func start(t *testing.T, env *testenv.Env, configure ...func(*keeper.Config)) (string, <-chan error, context.CancelFunc) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "k")
	if err := keeper.Dir(dir); err != nil {
		t.Fatal(err)
	}
	socket := keeper.SocketPath(dir, "test")
	pool, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool.MaxConns = 2
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	cfg := keeper.Config{
		Socket: socket,
		Secret: secret,
		ConnectLock: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.Connect(ctx, env.URL)
		},
		Pool:  pool,
		Ready: ready,
	}
	for _, c := range configure {
		c(&cfg)
	}
	go func() { done <- keeper.Serve(ctx, cfg) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("keeper: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("the keeper does not listen after 20s")
	}
	return socket, done, cancel
}

// running makes a RUNNING context and returns its id and run.
func running(t *testing.T, env *testenv.Env) (int64, etlcontext.Run) {
	t.Helper()
	ctx := context.Background()
	var id int64
	if err := env.Pool.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('k', 'q', 3)
		RETURNING etl_context_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:INITIAL", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	run, err := etlcontext.StartAttempt(ctx, env.Pool, id, 1, "test")
	if err != nil {
		t.Fatal(err)
	}
	return id, run
}

func dial(t *testing.T, env *testenv.Env, socket string, id int64, key string) (*keeper.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := keeper.Dial(ctx, socket, secret, id, key, nil)
	if err == nil {
		t.Cleanup(func() { c.Close(context.Background()) })
	}
	return c, err
}

// locked reports whether context id's lock is held, as a supervisor sees it.
func locked(t *testing.T, env *testenv.Env, id int64) bool {
	t.Helper()
	var held bool
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
		                  AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2)`,
		protocol.LockNamespace, id).Scan(&held); err != nil {
		t.Fatal(err)
	}
	return held
}

// A session is opened only with the key of its context's current run, and
// holds the lock for as long as it lasts: a second session of the same
// context is refused it, however the keeper's one lock session could take
// it again.
func TestASessionHoldsItsLockAloneWithItsRunsKey(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	ctx := context.Background()

	_, err := dial(t, env, socket, id, "not the key")
	if !errors.Is(err, keeper.ErrRefused) || !errors.Is(err, etlcontext.ErrStaleRun) {
		t.Fatalf("a session with a wrong key: %v, want refused as a stale run", err)
	}
	other, _ := running(t, env)
	if _, err := dial(t, env, socket, other, run.Key); !errors.Is(err, keeper.ErrRefused) {
		t.Fatalf("a session with another context's key: %v, want refused", err)
	}

	first, err := dial(t, env, socket, id, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if !locked(t, env, id) {
		t.Fatal("the lock is not held on the server")
	}
	c, err := etlcontext.Get(ctx, first, id)
	if err != nil || c.RunID == nil || *c.RunID != run.ID {
		t.Fatalf("read through the session: %+v, %v", c, err)
	}

	second, err := dial(t, env, socket, id, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Lock(ctx); !errors.Is(err, etlcontext.ErrLocked) {
		t.Fatalf("a second session's lock: %v, want ErrLocked", err)
	}
	first.Close(ctx)
	testenv.Eventually(t, 10*time.Second, "the first session's lock to be released", func() (bool, error) {
		return !locked(t, env, id), nil
	})
	if err := second.Lock(ctx); err != nil {
		t.Fatalf("the second session's lock once the first ended: %v", err)
	}
	if !locked(t, env, id) {
		t.Fatal("the second session's lock is not held on the server")
	}
}

// The keeper and a task process each prove they know their supervisor's
// secret before anything else is said: a process that poses as the keeper
// learns no key, and one that does not know the secret gets no session.
func TestOnlyWhoKnowsTheSecretTalksToTheKeeper(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := keeper.Dial(ctx, socket, []byte("another supervisor's secret"), id, run.Key, nil); !errors.Is(err, keeper.ErrHandshake) {
		t.Fatalf("a task process with another secret: %v, want refused", err)
	}

	// A process of the same user that took the socket's place.
	fake := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", fake)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	heard := make(chan []byte, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		// It answers with anything, and reads what comes.
		conn.Write(make([]byte, 64))
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		all, _ := io.ReadAll(conn)
		heard <- all
	}()
	if _, err := keeper.Dial(ctx, fake, secret, id, run.Key, nil); !errors.Is(err, keeper.ErrHandshake) {
		t.Fatalf("a keeper that does not know the secret: %v, want ErrHandshake", err)
	}
	if got := <-heard; strings.Contains(string(got), run.Key) || len(got) != 4+32 {
		t.Fatalf("the fake keeper heard %d bytes (%q): want only the handshake's opening", len(got), got)
	}
}

// relayEnv makes this test program a relay: "LISTEN TARGET" (relay).
const relayEnv = "DAMA_TEST_KEEPER_RELAY"

// relay is a process of the user that put a socket of its own in the
// keeper's place and passes every byte between the task process that
// connects to it and the real keeper, both ways, printing what it saw of
// the task process's to stdout at the end.
func relay(addrs string) {
	listen, target, _ := strings.Cut(addrs, " ")
	ln, err := net.Listen("unix", listen)
	if err != nil {
		os.Exit(2)
	}
	os.Stdout.WriteString("listening\n")
	in, err := ln.Accept()
	if err != nil {
		os.Exit(2)
	}
	out, err := net.Dial("unix", target)
	if err != nil {
		os.Exit(2)
	}
	go io.Copy(in, out)
	var seen strings.Builder
	io.Copy(io.MultiWriter(out, &seen), in)
	os.Stdout.WriteString(strconv.Quote(seen.String()) + "\n")
}

// A process of the same user that relays a task process's bytes to the
// real keeper and back, unchanged, gets nowhere: each side's proof names
// the pids the kernel gives of the two ends, and each finds the relay's
// where it expects the other's, so the task process says nothing more
// than its handshake's opening.
func TestARelayBetweenATaskProcessAndItsKeeperLearnsNothing(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	fake := filepath.Join(t.TempDir(), "relay.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayEnv+"="+fake+" "+socket)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "listening" {
		t.Fatalf("the relay did not start: %q", lines.Text())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := keeper.Dial(ctx, fake, secret, id, run.Key, nil); !errors.Is(err, keeper.ErrHandshake) {
		t.Fatalf("a session through a relay: %v, want ErrHandshake", err)
	}
	if !lines.Scan() {
		t.Fatal("the relay said nothing of what it saw")
	}
	seen, err := strconv.Unquote(lines.Text())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(seen, run.Key) || len(seen) != 4+32 {
		t.Fatalf("the relay saw %d bytes of the task process (%q): want only the handshake's opening", len(seen), seen)
	}
	// Without a relay, the same task process opens its session.
	if _, err := dial(t, env, socket, id, run.Key); err != nil {
		t.Fatal(err)
	}
}

// A cancellation is passed on to the session of the context it names only.
func TestACancellationReachesItsSessionOnly(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	ctx := context.Background()
	var sessions []*keeper.Conn
	var ids []int64
	for range 2 {
		id, run := running(t, env)
		c, err := dial(t, env, socket, id, run.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Listen(ctx, protocol.CancelChannel); err != nil {
			t.Fatal(err)
		}
		sessions, ids = append(sessions, c), append(ids, id)
	}
	for _, id := range ids {
		if _, err := env.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, protocol.CancelChannel, strconv.FormatInt(id, 10)); err != nil {
			t.Fatal(err)
		}
	}
	// Notifications come in order: the second session's first is its own.
	for i, c := range sessions {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		n, err := c.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		if n.Payload != strconv.FormatInt(ids[i], 10) {
			t.Errorf("session %d of context %d heard %q", i, ids[i], n.Payload)
		}
	}
}

// A keeper whose socket was removed (or replaced) exits: task processes
// would not find it, and the next keeper could not start beside it.
func TestAKeeperWhoseSocketWasRemovedExits(t *testing.T) {
	env := testenv.New(t)
	socket, done, cancel := start(t, env)
	defer cancel()
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("keeper: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the keeper still runs 20s after its socket was removed")
	}
}

// A process of the user that opens connections and proves nothing holds
// at most 64 of them, each for a few seconds: the keeper closes the next
// one at once, and a task process that meets a full keeper dials again
// until it gets its session.
func TestConnectionsThatProveNothingAreCapped(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 64 {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	extra, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the 65th connection that proves nothing: %v, want it closed by the keeper", err)
	}
	if _, err := dial(t, env, socket, id, run.Key); err != nil {
		t.Fatalf("a task process beside 64 connections that prove nothing: %v", err)
	}
}

// A message bound a session could not live with is refused before the
// keeper listens: below a notification's size, a session would stop
// forwarding at the first long one; below zero, every reply fails; above
// what a task process reads, a reply it cannot take ends its session.
func TestAKeeperRefusesAMessageBoundOutOfRange(t *testing.T) {
	for _, n := range []int{-1, 1, 8000, 64<<20 + 1} {
		// A keeper that got past the check would find no server here and,
		// idle, exit without an error.
		dir := filepath.Join(t.TempDir(), "k")
		if err := keeper.Dir(dir); err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.ParseConfig("host=" + dir)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = keeper.Serve(ctx, keeper.Config{
			Socket: keeper.SocketPath(dir, "test"),
			Secret: secret,
			ConnectLock: func(context.Context) (*pgx.Conn, error) {
				return nil, errors.New("no server here")
			},
			Pool:       pool,
			MaxMessage: n,
			IdleExit:   time.Millisecond,
		})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "MaxMessage") {
			t.Errorf("MaxMessage %d: Serve returned %v; want a refusal naming MaxMessage", n, err)
		}
	}
}

// A reply larger than a message may be fails its statement alone: the
// session and its lock go on, and the next statement runs. Messages of
// 1 MiB here: a reply of 64 MiB and more took 31 s of a busy run, and
// more than the keeper's minute on a slower machine.
func TestAReplyTooLargeFailsItsStatementOnly(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env, func(c *keeper.Config) { c.MaxMessage = 1 << 20 })
	id, run := running(t, env)
	ctx := context.Background()
	c, err := dial(t, env, socket, id, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var s string
	if err := c.QueryRow(ctx, `SELECT repeat('x', 1 << 20)`).Scan(&s); err == nil || !strings.Contains(err.Error(), "larger than the lock keeper's protocol takes") {
		t.Fatalf("a reply of 1 MiB and some: %v, want refused as too large", err)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT 1`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the next statement: %d, %v", n, err)
	}
	if !locked(t, env, id) {
		t.Fatal("the session lost its lock")
	}
}
