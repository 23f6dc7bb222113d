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
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/sql"
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
	id, _, err := etlcontext.CreateTask(context.Background(), env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	return id, env.Launch(id)
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

// lock has c's keeper take its context's lock.
func lock(c *keeper.Conn, id int64) error {
	rows, err := c.Lock(context.Background(), protocol.Version)
	_, err = etlcontext.ScanLockRun(id, rows, err)
	return err
}

// lockedTask is a RUNNING context and a session that holds its lock.
type lockedTask struct {
	id  int64
	run etlcontext.Run
	c   *keeper.Conn
}

// lockedTasks makes n RUNNING contexts, each with a session of the keeper
// of socket that holds its lock.
func lockedTasks(t *testing.T, env *testenv.Env, socket string, n int) []lockedTask {
	t.Helper()
	tasks := make([]lockedTask, n)
	for i := range tasks {
		id, run := running(t, env)
		c, err := dial(t, env, socket, id, run.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lock(c, id); err != nil {
			t.Fatal(err)
		}
		tasks[i] = lockedTask{id, run, c}
	}
	return tasks
}

// locked reports whether context id's lock is held, as a supervisor sees it,
// in this test's database: the tests running beside it number their tasks
// from 1 too.
func locked(t *testing.T, env *testenv.Env, id int64) bool {
	t.Helper()
	var held bool
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
		                  AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2
		                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`,
		protocol.LockNamespace, id).Scan(&held); err != nil {
		t.Fatal(err)
	}
	return held
}

// A session takes its lock only with the key of its context's current
// run, and runs no statement before, and holds the lock for as long as it
// lasts: a second session of the same context is refused it, however the
// keeper's one lock session could take it again.
func TestASessionHoldsItsLockAloneWithItsRunsKey(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	ctx := context.Background()

	other, _ := running(t, env)
	for _, s := range []struct {
		id  int64
		key string
	}{{id, "not the key"}, {other, run.Key}} {
		c, err := dial(t, env, socket, s.id, s.key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := etlcontext.Get(ctx, c, s.id); !errors.Is(err, keeper.ErrRefused) {
			t.Fatalf("a statement before the lock: %v, want refused", err)
		}
		// The keeper ended that session.
		if c, err = dial(t, env, socket, s.id, s.key); err != nil {
			t.Fatal(err)
		}
		if err := lock(c, s.id); !errors.Is(err, etlcontext.ErrStaleRun) {
			t.Fatalf("the lock of a session with a wrong key: %v, want refused as a stale run", err)
		}
		if locked(t, env, s.id) {
			t.Fatal("a session with a wrong key holds the lock")
		}
		if _, err := etlcontext.Get(ctx, c, s.id); !errors.Is(err, keeper.ErrClosed) {
			t.Fatalf("a statement after a refused lock: %v, want the session ended", err)
		}
	}

	first, err := dial(t, env, socket, id, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock(first, id); err != nil {
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
	if err := lock(second, id); !errors.Is(err, etlcontext.ErrLocked) {
		t.Fatalf("a second session's lock: %v, want ErrLocked", err)
	}
	first.Close(ctx)
	testenv.Eventually(t, 10*time.Second, "the first session's lock to be released", func() (bool, error) {
		return !locked(t, env, id), nil
	})
	if err := lock(second, id); err != nil {
		t.Fatalf("the second session's lock once the first ended: %v", err)
	}
	if !locked(t, env, id) {
		t.Fatal("the second session's lock is not held on the server")
	}
}

// A statement of a session runs with the session's run key alone,
// whatever an earlier statement left in the setting of the keeper's
// connection: the keeper sets the key in the statement's transaction
// before it, or, for a statement that sets the key itself
// (etlcontext.KeyParam), puts the key in its parameter, and the statement
// sets it first.
func TestAStatementRunsWithItsSessionsKeyAlone(t *testing.T) {
	env := testenv.New(t)
	taskURL := env.NewLogin(sql.RoleTask)
	socket := serve(t, env, func(c *keeper.Config) {
		pool, err := pgxpool.ParseConfig(taskURL)
		if err != nil {
			t.Fatal(err)
		}
		// One connection: each statement finds what the one before left.
		pool.MaxConns = 1
		c.Pool = pool
		c.ConnectLock = func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, taskURL) }
	})
	ctx := context.Background()
	tasks := lockedTasks(t, env, socket, 2)
	a, b := tasks[0], tasks[1]
	// B's session leaves its key as the connection's.
	if _, err := b.c.Exec(ctx, `SELECT set_config($1, $2, false)`, etlcontext.RunKeySetting, b.run.Key); err != nil {
		t.Fatal(err)
	}
	if err := etlcontext.RecordCommand(ctx, a.c, a.id, a.run.ID, 4242, 0); err != nil {
		t.Fatalf("A's own write: %v", err)
	}
	if err := etlcontext.RecordCommand(ctx, a.c, b.id, b.run.ID, 4242, 0); err == nil {
		t.Error("a statement of A that sets the key itself wrote B's row")
	}
	if err := etlcontext.ClearLockLost(ctx, a.c, b.id, b.run.ID); err == nil {
		t.Error("a statement of A wrote B's row")
	}
	var pgid *int
	if err := env.Pool.QueryRow(ctx, `SELECT command_pgid FROM data_manager.etl_contexts WHERE etl_context_id = $1`, b.id).Scan(&pgid); err != nil || pgid != nil {
		t.Errorf("B's command: %v, %v; want none recorded", pgid, err)
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

// A cancellation is passed on to the session of the context it names only,
// which listened before its lock, as a task process that connects again
// does: from its lock on.
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
		if err := lock(c, id); err != nil {
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
	refusedBeyondUnproven(t, socket, "the 65th connection that proves nothing")
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
	if err := lock(c, id); err != nil {
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

// A statement that finds every connection of the keeper's pool busy until
// its deadline fails for now, and its session, which is its lock, lives
// on: a thousand tasks that end at once each wait their turn to record
// their outcome rather than lose their lock.
func TestABusyKeeperKeepsTheSessionOfAStatementThatWaited(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env, func(c *keeper.Config) { c.Pool.MaxConns = 1 })
	tasks := lockedTasks(t, env, socket, 2)
	a, b := tasks[0].c, tasks[1]
	// A's transaction keeps the pool's one connection.
	tx, err := a.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The keeper gives a request at least a second: its answer comes after
	// this deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = b.c.Exec(ctx, `SELECT 1`)
	cancel()
	if !errors.Is(err, keeper.ErrUnavailable) {
		t.Errorf("a statement that waited for a busy pool: %v, want %v", err, keeper.ErrUnavailable)
	}
	if b.c.IsClosed() || !locked(t, env, b.id) {
		t.Fatalf("B's session closed: %v, its lock held: %v; want its session and lock kept", b.c.IsClosed(), locked(t, env, b.id))
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Exec(context.Background(), `SELECT 1`); err != nil {
		t.Errorf("B's statement once the pool is free: %v", err)
	}
}

// Sessions that ask for a task's lock with a wrong key, however often,
// never keep the one with the key from it: the keeper counts a session as
// the lock's holder only once the database took its key.
func TestAWrongKeyNeverKeepsTheRightOneFromItsLock(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// One lock a session: the keeper ends one whose key it refused.
				c, err := keeper.Dial(ctx, socket, secret, id, "a wrong key", nil)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("a session with a wrong key: %v", err)
					}
					return
				}
				err = lock(c, id)
				c.Close(ctx)
				if ctx.Err() == nil && !errors.Is(err, etlcontext.ErrStaleRun) {
					t.Errorf("a lock with a wrong key: %v, want %v", err, etlcontext.ErrStaleRun)
					return
				}
			}
		}()
	}
	for i := range 20 {
		c, err := dial(t, env, socket, id, run.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lock(c, id); err != nil {
			t.Fatalf("lock %d with the key, beside sessions with a wrong one: %v", i, err)
		}
		if err := c.Unlock(context.Background(), false); err != nil {
			t.Fatal(err)
		}
		c.Close(context.Background())
	}
}

// What a session's statements leave on a connection of the keeper's pool,
// the next session that runs a statement there does not find: settings,
// set by SET, by set_config or in a transaction, temporary tables,
// prepared statements, LISTENs, session locks. The keeper resets the
// connection, as it was when made (its AfterConnect's settings kept),
// before the pool hands it out again.
func TestASessionLeavesNothingOnThePoolForTheNext(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env, func(c *keeper.Config) {
		// One connection: each statement finds what the one before left.
		c.Pool.MaxConns = 1
		c.Pool.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET lock_timeout = '7s'")
			return err
		}
	})
	ctx := context.Background()
	tasks := lockedTasks(t, env, socket, 2)
	a, b := tasks[0].c, tasks[1].c
	const probe = `SELECT format('%s|%s|%s|%s|%s|%s|%s|%s', pg_backend_pid(),
		current_setting('search_path'), current_setting('statement_timeout'), current_setting('application_name'),
		current_setting('lock_timeout'), to_regclass('pg_temp.leak') IS NOT NULL,
		(SELECT count(*) FROM pg_prepared_statements) + (SELECT count(*) FROM pg_listening_channels()),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()))`
	var before string
	if err := b.QueryRow(ctx, probe).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(before, "|7s|") {
		t.Fatalf("the pool's connection before: %s; want its AfterConnect's lock_timeout", before)
	}
	for _, stmt := range []string{
		`SET search_path = pg_catalog`,
		`SELECT set_config('statement_timeout', '1234', false)`,
		`SET lock_timeout = '1s'`,
		`CREATE TEMP TABLE leak (x int)`,
		`PREPARE leak AS SELECT 1`,
		`LISTEN leak`,
		`SELECT pg_advisory_lock(4242)`,
	} {
		if _, err := a.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		var after string
		if err := b.QueryRow(ctx, probe).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("after A's %s, B finds %s; want %s", stmt, after, before)
		}
	}
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('application_name', 'leak', false)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := b.QueryRow(ctx, probe).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("after A's transaction, B finds %s; want %s", after, before)
	}
}

// A session whose key the keeper has yet to take may ask for its lock,
// once and at once, and nothing else: not a ping, nor an unlock that would
// tell the supervisors its task ended. Such sessions count among the 64
// connections that have not proved themselves, and each is ended within
// seconds if it asks nothing.
func TestASessionThatHasNotProvedItsKeyMayOnlyTakeItsLock(t *testing.T) {
	env := testenv.New(t)
	socket := serve(t, env)
	id, run := running(t, env)
	ctx := context.Background()
	for name, ask := range map[string]func(c *keeper.Conn) error{
		"a ping":    func(c *keeper.Conn) error { return c.Ping(ctx) },
		"an unlock": func(c *keeper.Conn) error { return c.Unlock(ctx, true) },
	} {
		c, err := dial(t, env, socket, id, run.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := ask(c); !errors.Is(err, keeper.ErrRefused) {
			t.Errorf("%s before the lock: %v, want refused", name, err)
		}
		if err := lock(c, id); !errors.Is(err, keeper.ErrClosed) {
			t.Errorf("a lock after %s: %v, want the session ended", name, err)
		}
	}

	var silent []*keeper.Conn
	for range 64 {
		c, err := dial(t, env, socket, id, run.Key)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	refusedBeyondUnproven(t, socket, "a connection beside 64 sessions that did not prove their key")
	for i, c := range silent {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := c.WaitForNotification(wctx)
		cancel()
		if !errors.Is(err, keeper.ErrClosed) {
			t.Fatalf("session %d, silent since its hello: %v, want it ended by the keeper", i, err)
		}
	}
	c, err := dial(t, env, socket, id, run.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock(c, id); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("a ping once the lock is taken: %v", err)
	}
}

// refusedBeyondUnproven checks that the keeper closes at once a connection
// beyond the 64 that have yet to prove themselves. The deadline only bounds
// a failure: a closed connection reads EOF at once.
func refusedBeyondUnproven(t *testing.T, socket, what string) {
	t.Helper()
	extra, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v, want it closed by the keeper", what, err)
	}
}
