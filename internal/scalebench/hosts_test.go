package scalebench_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// The hosts' network: a bridge in this namespace, the server on its first
// address, host i on .(10+i). Every link, namespace and nftables table the
// harness makes is named with hostPrefix (hostTable for nftables, which
// takes no dash), so that a run removes what an interrupted one left.
const (
	hostPrefix = "damah-"
	hostBridge = hostPrefix + "br"
	hostTable  = "damah_cut"
	hostNet    = "10.77.0"
	serverAddr = hostNet + ".1"
)

// The hosts' settings, short enough that a cut host's tasks run elsewhere
// within moveGoal of the cut. A task's lock connection goes silent
// unnoticed for at most silenceBound (heartbeat_interval + 3 probes of
// max(1s, min(5s, heartbeat_interval/2)): docs/architecture.md "The lock
// protocol"); its command then runs at most reconnect_grace + kill_grace
// more: fenceBound. The server frees its lock 25 s after the last packet
// it got (its keepalives); a supervisor whose job is held by the cut
// host's supervisor takes it once that one's liveness lock is missing for
// max(2 x poll_interval, 10s); it then waits fence_window (fenceBound +
// 2s) from when it first finds the task's lock free, and starts the task
// at its next look: about 25 + 10 + 32 s and three poll intervals.
const (
	hostHeartbeat  = 2 * time.Second
	reconnectGrace = 20 * time.Second
	killGrace      = 5 * time.Second
	silenceBound   = hostHeartbeat + 3*time.Second
	fenceBound     = silenceBound + reconnectGrace + killGrace
	fenceWindow    = fenceBound + 2*time.Second
	moveGoal       = 90 * time.Second
	adoptGoal      = 5 * time.Second
)

// hostPoll is the hosts' poll_interval: 1s, so that three of them fit in
// moveGoal on a loaded machine (at the default 5s, 3 hosts and 30 tasks
// took 97 s); DAMA_BENCH_HOSTS_POLL sets another, e.g. 5s to measure the
// quiet cost at the default.
var hostPoll = time.Second

// BenchmarkHosts runs, for each H of DAMA_BENCH_HOSTS (1,3,6), H hosts on
// this machine, each in network, UTS, PID and mount namespaces of its own
// (so that dama, which tells hosts by boot id and PID namespace, sees H
// hosts), with one supervisor in host lock mode and DAMA_BENCH_HOSTS_N
// (500) quiet tasks a host, all on one PostgreSQL server on the hosts'
// bridge. It prints the server connections of each host, the
// transactions/s with every task quiet over DAMA_BENCH_WINDOW (60s) and
// the task processes' PSS; at the largest H, it SIGKILLs and restarts one
// host's supervisor and times the adoption of its tasks, then cuts one
// host off with nftables (cutHost). Run it with scripts/bench.sh hosts
// (root); it is never part of go test ./...
func BenchmarkHosts(b *testing.B) {
	sizes, n, window, settle := hostsParams(b)
	bins := buildHelpers(b)
	fmt.Printf("hosts benchmark: H %v, %d tasks a host, window %s after a %s settle; poll_interval %s, heartbeat_interval %s, reconnect_grace %s, kill_grace %s\n",
		sizes, n, window, settle, hostPoll, hostHeartbeat, reconnectGrace, killGrace)
	for i, h := range sizes {
		b.Run(fmt.Sprintf("H%d-N%d", h, n), func(b *testing.B) {
			c := newCluster(b, bins, h)
			c.submit(n * h)
			c.steady(window, settle)
			if i == len(sizes)-1 {
				if h > 1 {
					c.restartOne()
					c.cutHost()
				}
				c.settle()
			}
		})
	}
}

// TestHostsCut is the cut-host case at a small size (3 hosts, 30 tasks),
// run by scripts/test-hosts.sh: it needs root, and takes minutes.
func TestHostsCut(t *testing.T) {
	if os.Getenv("DAMA_TEST_HOSTS") == "" {
		t.Skip("run by scripts/test-hosts.sh (root, a few minutes)")
	}
	c := newCluster(t, buildHelpers(t), 3)
	c.submit(30)
	c.cutHost()
	c.settle()
}

func hostsParams(b *testing.B) (sizes []int, n int, window, settle time.Duration) {
	for _, s := range strings.Split(envOr("DAMA_BENCH_HOSTS", "1,3,6"), ",") {
		h, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || h < 1 || h > 200 {
			b.Fatalf("DAMA_BENCH_HOSTS: %q is not a number of hosts (1 to 200)", s)
		}
		sizes = append(sizes, h)
	}
	n, err := strconv.Atoi(envOr("DAMA_BENCH_HOSTS_N", "500"))
	if err != nil || n < 1 {
		b.Fatalf("DAMA_BENCH_HOSTS_N: %q is not a positive number", os.Getenv("DAMA_BENCH_HOSTS_N"))
	}
	window, settle = 60*time.Second, 15*time.Second
	for name, d := range map[string]*time.Duration{"DAMA_BENCH_WINDOW": &window, "DAMA_BENCH_SETTLE": &settle, "DAMA_BENCH_HOSTS_POLL": &hostPoll} {
		if v := os.Getenv(name); v != "" {
			if *d, err = time.ParseDuration(v); err != nil || *d <= 0 {
				b.Fatalf("%s: %q is not a positive duration", name, v)
			}
		}
	}
	return sizes, n, window, settle
}

// cluster is H hosts and their server.
type cluster struct {
	tb    testing.TB
	env   *testenv.Env
	bins  helpers
	mon   *pgx.Conn
	dbURL string // the test's database over the bridge
	// release is the quiet commands' release file; lockDir holds the flock
	// of each task's command, shared by every host.
	release, lockDir string
	hosts            []*host
	client           *dama.Client
	down             sync.Once
}

// host is one host: its namespaces' first process, hostinit, and its
// supervisor, entered into them by nsenter.
type host struct {
	name, addr, veth string
	init             *exec.Cmd
	pidNS            string // the link /proc/PID/ns/pid of its processes
	cfg              string
	sup              *testenv.Proc
	clientID         string
}

func (h *host) pid() string { return strconv.Itoa(h.init.Process.Pid) }

func (c *cluster) say(format string, args ...any) {
	fmt.Printf("[H%d] %s\n", len(c.hosts), fmt.Sprintf(format, args...))
}

func newCluster(tb testing.TB, bins helpers, n int) *cluster {
	if os.Geteuid() != 0 {
		tb.Skip("the hosts benchmark needs root: network, PID and mount namespaces, nftables")
	}
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("%s not found: install iproute2, nftables and util-linux", tool)
		}
	}
	release, err := lockHosts(hostsLock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(release)
	removeStale(tb)
	c := &cluster{tb: tb, bins: bins}
	run(tb, "ip", "link", "add", hostBridge, "type", "bridge")
	tb.Cleanup(func() { _, _ = command("ip", "link", "del", hostBridge) })
	run(tb, "ip", "addr", "add", serverAddr+"/24", "dev", hostBridge)
	run(tb, "ip", "link", "set", hostBridge, "up")

	// The server listens on the bridge, trusting its hosts.
	// Not tb.TempDir, whose parent the server's user may not enter.
	hbaDir, err := os.MkdirTemp("", hostPrefix+"hba-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(hbaDir) })
	if err := os.Chmod(hbaDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	hba := filepath.Join(hbaDir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all "+hostNet+".0/24 trust\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	srv := testenv.NewServerWith(tb, fmt.Sprintf("listen_addresses = '127.0.0.1,%s'\nhba_file = '%s'", serverAddr, hba))
	c.env = testenv.NewOn(tb, srv)
	c.dbURL = strings.Replace(c.env.URL, "@127.0.0.1:", "@"+serverAddr+":", 1)
	c.mon = connect(tb, c.env.URL, "dama-hostsbench-monitor", nil)
	var dataDir string
	if err := c.mon.QueryRow(context.Background(), `SHOW data_directory`).Scan(&dataDir); err != nil {
		tb.Fatal(err)
	}
	// The hosts go first, before the server and the bridge.
	tb.Cleanup(c.teardown)
	// Interrupted, the test's cleanups would not run: do the harness's
	// own here, and stop the server (its postmaster, by its pid file).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stop := make(chan struct{})
	tb.Cleanup(func() { signal.Stop(sigs); close(stop) })
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "hosts: %s: removing the hosts and stopping the server\n", s)
			c.teardown()
			_, _ = command("ip", "link", "del", hostBridge)
			if pidFile, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid")); err == nil {
				if pid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0]); err == nil {
					_ = syscall.Kill(pid, syscall.SIGQUIT)
					for i := 0; i < 100 && testenv.Alive(pid); i++ {
						time.Sleep(100 * time.Millisecond) // deliberately: no signal tells another process's end
					}
				}
			}
			os.RemoveAll(filepath.Dir(dataDir))
			os.RemoveAll(hbaDir)
			os.Exit(1)
		case <-stop:
		}
	}()

	c.release = filepath.Join(c.env.Dir, "release")
	c.lockDir = filepath.Join(c.env.Dir, "locks")
	if err := os.Mkdir(c.lockDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		c.startHost(i + 1)
	}
	for _, h := range c.hosts {
		c.startSupervisor(h)
	}
	cfg, err := config.Load(c.hosts[0].cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if c.client, err = dama.NewClient(newPool(tb, c.env.URL, "dama-hostsbench-submit"), cfg); err != nil {
		tb.Fatal(err)
	}
	return c
}

// startHost starts host i: hostinit in namespaces of its own, a veth pair
// from the bridge to its eth0, its address, its configuration.
func (c *cluster) startHost(i int) {
	tb := c.tb
	h := &host{name: fmt.Sprintf("%s%d", hostPrefix, i), addr: fmt.Sprintf("%s.%d", hostNet, 10+i), veth: fmt.Sprintf("%sv%d", hostPrefix, i)}
	h.init = exec.Command(c.bins.hostinit, h.name)
	// Pdeathsig: should the harness die without its cleanups, its hosts die too.
	h.init.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		Pdeathsig:  syscall.SIGKILL, Setpgid: true,
	}
	h.init.Stderr = os.Stderr
	out, err := h.init.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.init.Start(); err != nil {
		tb.Fatalf("start host %s: %v", h.name, err)
	}
	c.hosts = append(c.hosts, h) // for teardown, before anything can fail
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			tb.Fatalf("host %s: hostinit: %v", h.name, err)
		}
	case <-time.After(30 * time.Second):
		tb.Fatalf("host %s: hostinit not ready after 30s", h.name)
	}
	if h.pidNS, err = os.Readlink("/proc/" + h.pid() + "/ns/pid"); err != nil {
		tb.Fatal(err)
	}
	run(tb, "ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.pid())
	run(tb, "ip", "link", "set", h.veth, "master", hostBridge, "up")
	c.inHost(h, "ip", "addr", "add", h.addr+"/24", "dev", "eth0")
	c.inHost(h, "ip", "link", "set", "eth0", "up")
	c.inHost(h, "ip", "link", "set", "lo", "up")

	h.cfg = c.env.WriteConfig(strings.NewReplacer(
		"LOGDIR", strconv.Quote(filepath.Join(c.env.Dir, h.name, "logs")),
		"POLL", hostPoll.String(), "HEARTBEAT", hostHeartbeat.String(),
		"RECONNECT", reconnectGrace.String(), "KILL", killGrace.String(),
		"QUIET", quietKind, "BIN", strconv.Quote(c.bins.quiet),
		"RELEASE", strconv.Quote(c.release), "LOCKS", strconv.Quote(c.lockDir),
	).Replace(`
lock_mode: host
log_dir: LOGDIR
poll_interval: POLL
heartbeat_interval: HEARTBEAT
reconnect_grace: RECONNECT
kill_grace: KILL
queues:
  QUIET: { max_running: 10000 }
kinds:
  QUIET:
    queue: QUIET
    command: [BIN, RELEASE, LOCKS]
`))
}

// inHost runs a command in h's network namespace.
func (c *cluster) inHost(h *host, args ...string) {
	run(c.tb, "nsenter", append([]string{"--target", h.pid(), "--net", "--"}, args...)...)
}

// startSupervisor starts h's supervisor in h's namespaces and waits for it.
func (c *cluster) startSupervisor(h *host) {
	h.sup = c.env.StartWith(h.cfg, []string{"DATABASE_URL=" + c.dbURL},
		[]string{"nsenter", "--target", h.pid(), "--net", "--uts", "--pid", "--mount", "--"}, "supervisor")
	h.clientID = waitStarted(c.tb, h.sup)
}

// supervisorPID is the pid of h's supervisor here: nsenter's child.
func (c *cluster) supervisorPID(h *host) int {
	kids := scalebench.Children(h.sup.Cmd.Process.Pid)
	if len(kids) != 1 {
		c.tb.Fatalf("host %s: nsenter %d has %d children, not its supervisor alone", h.name, h.sup.Cmd.Process.Pid, len(kids))
	}
	return kids[0]
}

// teardown kills every host, by its first process (which kills its
// namespaces and all in them, its veth pair too), and removes the
// nftables tables of a cut.
func (c *cluster) teardown() {
	c.down.Do(func() {
		for _, h := range c.hosts {
			_ = h.init.Process.Kill()
			_ = h.init.Wait()
			_, _ = command("ip", "link", "del", h.veth)
		}
		_, _ = command("nft", "delete", "table", "netdev", hostTable)
	})
}

// removeStale removes what an interrupted run left: hosts (hostinit
// processes named with hostPrefix), links and nftables tables.
func removeStale(tb testing.TB) {
	for _, pid := range scalebench.Pids() {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if len(args) == 2 && filepath.Base(args[0]) == "hostinit" && strings.HasPrefix(args[1], hostPrefix) && pid != os.Getpid() {
			fmt.Fprintf(os.Stderr, "hosts: killing the stale host %s (pid %d)\n", args[1], pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	out, err := command("ip", "-o", "link", "show")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(out)) {
		// "5: damah-v1@if2: <BROADCAST,..."
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, hostPrefix) {
			fmt.Fprintf(os.Stderr, "hosts: removing the stale link %s\n", name)
			_, _ = command("ip", "link", "del", name)
		}
	}
	if out, err := command("nft", "list", "tables"); err == nil && bytes.Contains(out, []byte(hostTable)) {
		fmt.Fprintf(os.Stderr, "hosts: removing the stale nftables table %s\n", hostTable)
		_, _ = command("nft", "delete", "table", "netdev", hostTable)
	}
}

func command(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if _, err := command(name, args...); err != nil {
		tb.Fatal(err)
	}
}

// submit submits n quiet tasks and waits until all hold their lock.
func (c *cluster) submit(n int) {
	tb, ctx := c.tb, context.Background()
	began := time.Now()
	for range n {
		if _, _, err := c.client.Submit(ctx, dama.SubmitParams{Kind: quietKind}); err != nil {
			tb.Fatal(err)
		}
	}
	lastReport := time.Now()
	testenv.EventuallyEvery(tb, time.Second, 10*time.Minute, fmt.Sprintf("all %d tasks to hold their lock", n), func() (bool, error) {
		var locked, finished, retried int
		if err := c.mon.QueryRow(ctx, lockQuery, quietKind, protocol.LockNamespace).Scan(&locked, &finished, &retried); err != nil {
			tb.Fatal(err)
		}
		if finished > 0 || retried > 0 {
			tb.Fatalf("%d quiet tasks finished and %d were retried while starting", finished, retried)
		}
		if time.Since(lastReport) >= 10*time.Second {
			fmt.Fprintf(os.Stderr, "[H%d] %d of %d hold their lock after %.0f s\n", len(c.hosts), locked, n, time.Since(began).Seconds())
			lastReport = time.Now()
		}
		return locked == n, fmt.Errorf("%d of %d hold their lock", locked, n)
	})
	c.say("all %d tasks hold their lock %.1f s after the first submit; by host: %s", n, time.Since(began).Seconds(), c.byHost())
}

// byHost is how many quiet tasks run on each host, as they recorded.
func (c *cluster) byHost() string {
	var s string
	if err := c.mon.QueryRow(context.Background(), `
		SELECT string_agg(host || ' ' || n, ', ' ORDER BY host) FROM (
		  SELECT coalesce(host, '(none)') AS host, count(*) AS n FROM data_manager.etl_contexts
		   WHERE kind = $1 AND etl_status = 'RUNNING' GROUP BY 1) AS h`, quietKind).Scan(&s); err != nil {
		c.tb.Fatal(err)
	}
	return s
}

// quietOf lists the quiet commands running on h (all hosts: nil), by
// their pid here.
func (c *cluster) quietOf(h *host) []int {
	var pids []int
	for _, pid := range scalebench.ProcessesOf(c.bins.quiet, c.release) {
		if h == nil {
			pids = append(pids, pid)
		} else if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && ns == h.pidNS {
			pids = append(pids, pid)
		}
	}
	return pids
}

// steady prints, with every task quiet, each host's server connections
// after the starts and once idle ones had time to close, the
// transactions/s over window, and the task processes' PSS.
func (c *cluster) steady(window, settle time.Duration) {
	tb, ctx := c.tb, context.Background()
	started := time.Now()
	c.connections("after the starts")
	// Every runner is its command's parent; a host's memory per task is
	// the PSS of its runners, lock keeper and supervisor over its tasks.
	var pss []float64
	var hostPSS []string
	for _, h := range c.hosts {
		var sum float64
		quiet := c.quietOf(h)
		for _, pid := range quiet {
			st, err := scalebench.ReadProcStat(pid)
			if err != nil {
				continue
			}
			if b, err := scalebench.PSS(st.PPID); err == nil {
				pss = append(pss, float64(b)/(1<<20))
				sum += float64(b) / (1 << 20)
			}
		}
		var all float64
		for _, pid := range scalebench.Pids() {
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && ns == h.pidNS && !slices.Contains(quiet, pid) {
				if b, err := scalebench.PSS(pid); err == nil {
					all += float64(b) / (1 << 20)
				}
			}
		}
		hostPSS = append(hostPSS, fmt.Sprintf("%s %.2f", h.name, all/float64(max(len(quiet), 1))))
	}
	c.say("task process PSS: median %.2f MB of %d; dama's PSS on a host per task (runners, keeper, supervisor): %s MB",
		scalebench.Median(pss), len(pss), strings.Join(hostPSS, ", "))

	// An idle backend reports its transactions up to 10s late: those of
	// the starts must not fall in the window.
	time.Sleep(settle) // deliberately: the server's statistics delay
	xacts := func() int64 {
		var n int64
		if _, err := c.mon.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			tb.Fatal(err)
		}
		if err := c.mon.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			tb.Fatal(err)
		}
		return n
	}
	before := xacts()
	time.Sleep(window) // deliberately: the window measured
	tps := float64(xacts()-before-2) / window.Seconds()
	c.say("transactions/s with every task quiet, over %s: %.2f in all, %.2f per host", window, tps, tps/float64(len(c.hosts)))

	// The pools close their idle connections: the supervisor's within a
	// minute, the lock keeper's within two (idle a minute, looked at each
	// minute). Polled, not waited on: the count is the measurement.
	for time.Since(started) < 2*time.Minute+10*time.Second && c.connections("") > 4 {
		time.Sleep(time.Second) // deliberately: a poll of pg_stat_activity
	}
	c.connections(fmt.Sprintf("%.0f s after the starts, every task quiet", time.Since(started).Seconds()))
}

// connections counts each host's server connections, by what holds them
// (application_name up to its ':'), prints them with when, unless when is
// empty, and returns the most a host holds.
func (c *cluster) connections(when string) int {
	tb, ctx := c.tb, context.Background()
	rows, err := c.mon.Query(ctx, `
		SELECT host(client_addr), split_part(application_name, ':', 1), count(*) FROM pg_stat_activity
		 WHERE datname = current_database() AND client_addr << $1::cidr GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2`, hostNet+".0/24")
	if err != nil {
		tb.Fatal(err)
	}
	conns, what := map[string]int{}, map[string][]string{}
	var addr, app string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&addr, &app, &n}, func() error {
		conns[addr] += n
		what[addr] = append(what[addr], fmt.Sprintf("%s %d", app, n))
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	most := 0
	for _, h := range c.hosts {
		if when != "" {
			c.say("server connections of %s, %s: %d (%s)", h.name, when, conns[h.addr], strings.Join(what[h.addr], ", "))
		}
		most = max(most, conns[h.addr])
	}
	if when != "" {
		c.say("server connections, %s: at most %d a host (goal <= 4)", when, most)
	}
	return most
}

// restartOne SIGKILLs the last host's supervisor, starts another there,
// and times how long until every job the killed one held is held by a
// live supervisor, none relaunched.
func (c *cluster) restartOne() {
	tb, ctx := c.tb, context.Background()
	h := c.hosts[len(c.hosts)-1]
	rows, err := c.mon.Query(ctx, `
		SELECT c.etl_context_id FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.kind = $1 AND j.state = 'running' AND j.attempted_by[array_upper(j.attempted_by, 1)] = $2`, quietKind, h.clientID)
	if err != nil {
		tb.Fatal(err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		tb.Fatal(err)
	}
	attempts := c.attempts()
	quiet := c.quietOf(nil)
	if err := syscall.Kill(c.supervisorPID(h), syscall.SIGKILL); err != nil {
		tb.Fatal(err)
	}
	_ = h.sup.Wait()
	c.startSupervisor(h)
	started := time.Now()
	var live []string
	for _, o := range c.hosts {
		live = append(live, o.clientID)
	}
	waitAdopted(tb, c.mon, held, live, 2*time.Minute)
	took := time.Since(started)
	if a := c.attempts(); a != attempts {
		tb.Fatalf("after the restart, %d attempts, not %d: a task was relaunched", a, attempts)
	}
	if q := c.quietOf(nil); !slices.Equal(q, quiet) {
		tb.Fatalf("after the restart, the commands changed: %d then %d", len(quiet), len(q))
	}
	c.say("SIGKILLed %s's supervisor and started another: the %d jobs it held adopted %.1f s after it started (goal <= %s), none relaunched",
		h.name, len(held), took.Seconds(), adoptGoal)
}

// attempts counts the quiet tasks' attempts.
func (c *cluster) attempts() int {
	var n int
	if err := c.mon.QueryRow(context.Background(), `
		SELECT count(*) FROM data_manager.etl_attempts AS a JOIN data_manager.etl_contexts AS c USING (etl_context_id) WHERE c.kind = $1`, quietKind).Scan(&n); err != nil {
		c.tb.Fatal(err)
	}
	return n
}

// cutHost cuts the busiest host off with nftables, dropping every packet it
// sends or is sent, with no RST and no error on its side: drops at the
// ingress of its veth here and of its eth0 there, so that a sender's
// packets leave and are lost, as when a network path dies. Its processes
// run on. It asserts that its tasks' commands are gone within fenceWindow,
// that all of its tasks run again on other hosts within moveGoal, that no
// two attempts of a task ran at once (watch), and, once the host is back,
// that it started nothing.
func (c *cluster) cutHost() {
	tb, ctx := c.tb, context.Background()
	// The busiest host: where River's fetches placed the tasks is chance.
	var h *host
	var ids []int64
	for _, o := range c.hosts {
		rows, err := c.mon.Query(ctx, `SELECT etl_context_id FROM data_manager.etl_contexts WHERE kind = $1 AND host = $2 AND etl_status = 'RUNNING'`, quietKind, o.name)
		if err != nil {
			tb.Fatal(err)
		}
		on, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			tb.Fatal(err)
		}
		if h == nil || len(on) > len(ids) {
			h, ids = o, on
		}
	}
	supPID := c.supervisorPID(h)
	w := c.watch()
	defer w.stop()

	ruleset := func(dev string) string {
		return fmt.Sprintf("table netdev %s {\n\tchain ingress {\n\t\ttype filter hook ingress device %q priority -500; policy drop;\n\t}\n}\n", hostTable, dev)
	}
	apply := func(rules string, args ...string) {
		cmd := exec.Command(args[0], append(args[1:], "nft", "-f", "-")...)
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("cut %s: %v\n%s\n%s", h.name, err, out, rules)
		}
	}
	var cutAt time.Time
	if err := c.mon.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&cutAt); err != nil {
		tb.Fatal(err)
	}
	apply(ruleset(h.veth), "env")
	apply(ruleset("eth0"), "nsenter", "--target", h.pid(), "--net", "--")
	cut := time.Now()
	restored := false
	restore := func() {
		if !restored {
			restored = true
			_, _ = command("nft", "delete", "table", "netdev", hostTable)
			_, _ = command("nsenter", "--target", h.pid(), "--net", "--", "nft", "delete", "table", "netdev", hostTable)
		}
	}
	defer restore()
	c.say("cut %s off (nftables netdev ingress drops on %s and its eth0) with %d tasks; fence bound %s (silence %s + reconnect_grace %s + kill_grace %s), fence_window %s; goal: all running elsewhere within %s",
		h.name, h.veth, len(ids), fenceBound, silenceBound, reconnectGrace, killGrace, fenceWindow, moveGoal)

	// Silence, not an error: a connection from the host to the server
	// times out, where a drop on output would fail at once (EPERM).
	if err := probeSilence(h, fmt.Sprintf("%s:%d", serverAddr, c.env.Server.Port())); err != nil {
		tb.Fatal(err)
	}

	var gone, moved time.Duration
	testenv.EventuallyEvery(tb, 100*time.Millisecond, moveGoal+30*time.Second, fmt.Sprintf("%s's commands gone and its tasks running elsewhere", h.name), func() (bool, error) {
		if gone == 0 && len(c.quietOf(h)) == 0 {
			gone = time.Since(cut)
			c.say("%s's commands all gone %.1f s after the cut", h.name, gone.Seconds())
		}
		if moved == 0 {
			var elsewhere int
			if err := c.mon.QueryRow(ctx, `
				SELECT count(*) FROM data_manager.etl_contexts AS c
				  JOIN pg_locks AS l ON l.locktype = 'advisory' AND l.granted
				   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				   AND l.classid::bigint = $3 AND l.objsubid = 2 AND l.objid::bigint = c.etl_context_id
				 WHERE c.etl_context_id = ANY($1) AND c.etl_status = 'RUNNING' AND c.host <> $2`, ids, h.name, protocol.LockNamespace).Scan(&elsewhere); err != nil {
				tb.Fatal(err)
			}
			if elsewhere == len(ids) {
				moved = time.Since(cut)
				c.say("all %d of %s's tasks hold their lock on other hosts %.1f s after the cut; by host: %s", len(ids), h.name, moved.Seconds(), c.byHost())
			}
		}
		return gone > 0 && moved > 0, fmt.Errorf("commands gone after %s, tasks moved after %s", gone, moved)
	})
	// When the new attempts started, by the server's clock: the first after
	// the fence, the rest as fast as the other hosts start tasks.
	var first, median, last float64
	if err := c.mon.QueryRow(ctx, `
		SELECT extract(epoch FROM min(started_at) - $2)::float8,
		       extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY started_at) - $2)::float8,
		       extract(epoch FROM max(started_at) - $2)::float8
		  FROM data_manager.etl_attempts WHERE etl_context_id = ANY($1) AND started_at > $2`, ids, cutAt).Scan(&first, &median, &last); err != nil {
		tb.Fatal(err)
	}
	c.say("the new attempts of %s's tasks started %.1f s (first), %.1f s (median), %.1f s (last) after the cut", h.name, first, median, last)
	if gone > fenceWindow {
		tb.Errorf("%s's commands ran %.1f s after the cut, past the fence window %s", h.name, gone.Seconds(), fenceWindow)
	}
	if moved > moveGoal {
		tb.Errorf("%s's tasks ran again elsewhere %.1f s after the cut, past %s", h.name, moved.Seconds(), moveGoal)
	}
	if !testenv.Alive(supPID) || !testenv.Alive(h.init.Process.Pid) {
		tb.Fatalf("%s's supervisor or first process died while it was cut off", h.name)
	}

	// Back: it must start nothing (every task runs elsewhere). It is heard
	// again once it holds connections to the server; then it is watched
	// for a fence window more.
	restore()
	back := time.Now()
	testenv.Eventually(tb, time.Minute, h.name+"'s supervisor to reconnect", func() (bool, error) {
		var n int
		err := c.mon.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE host(client_addr) = $1 AND application_name LIKE 'dama-supervisor-liveness:%'`, h.addr).Scan(&n)
		return n > 0, err
	})
	c.say("%s back: its supervisor reconnected %.1f s after the rules were removed", h.name, time.Since(back).Seconds())
	time.Sleep(fenceWindow) // deliberately: the span in which it could start a second copy
	var started int
	if err := c.mon.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_attempts WHERE host = $1 AND started_at > $2`, h.name, cutAt).Scan(&started); err != nil {
		tb.Fatal(err)
	}
	if started > 0 || len(c.quietOf(h)) > 0 {
		tb.Fatalf("%s started %d attempts after the cut (%d commands running there)", h.name, started, len(c.quietOf(h)))
	}
	w.stop()
	w.check(c)
	c.say("%s started nothing once back; never two attempts of a task at once: %s", h.name, w)
}

// probeSilence checks, from inside h, that a TCP connection to addr is
// neither answered nor refused, nor fails at once, within 2 s: silence.
func probeSilence(h *host, addr string) error {
	errc := make(chan error, 1)
	go func() {
		// The goroutine's thread enters h's network namespace and comes
		// back: a thread that ended would fire the Pdeathsig of the hosts'
		// first processes it started.
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		ns, err := os.Open("/proc/" + h.pid() + "/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s's network namespace: %w", h.name, err)
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		switch ne, ok := err.(net.Error); {
		case err == nil:
			conn.Close()
			errc <- fmt.Errorf("%s, cut off, connected to %s", h.name, addr)
		case !ok || !ne.Timeout():
			errc <- fmt.Errorf("%s, cut off, got an error connecting to %s, not silence: %w", h.name, addr, err)
		default:
			errc <- nil
		}
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) != nil {
			select {} // the thread, in h's namespace, must neither serve others nor end
		}
		runtime.UnlockOSThread()
	}()
	return <-errc
}

// watcher samples, while a host is cut off and after, for two attempts of
// one task at once: on the server every 10 ms (two holders of a context's
// lock, two attempts not ended), and among the processes (two commands of
// one task) 100 ms after each scan of /proc; the commands' own flock
// catches what falls between samples.
type watcher struct {
	done                       chan struct{}
	began, ended               time.Time
	wg                         sync.WaitGroup
	stopOnce                   sync.Once
	serverSamples, procSamples atomic.Int64
	mu                         sync.Mutex
	violations                 []string
}

func (c *cluster) watch() *watcher {
	w := &watcher{done: make(chan struct{}), began: time.Now()}
	conn := connect(c.tb, c.env.URL, "dama-hostsbench-watch", nil)
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
			var locks, open []int64
			err := conn.QueryRow(context.Background(), `
				SELECT coalesce((SELECT array_agg(objid::bigint) FROM (
				         SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid::bigint = $1 AND objsubid = 2
				            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
				          GROUP BY objid HAVING count(*) > 1) AS l), '{}'),
				       coalesce((SELECT array_agg(etl_context_id) FROM (
				         SELECT etl_context_id FROM data_manager.etl_attempts WHERE ended_at IS NULL
				          GROUP BY 1 HAVING count(*) > 1) AS a), '{}')`, protocol.LockNamespace).Scan(&locks, &open)
			if err != nil {
				w.add(fmt.Sprintf("sample the server: %v", err))
				return
			}
			w.serverSamples.Add(1)
			for _, id := range locks {
				w.add(fmt.Sprintf("task %d: two holders of its lock", id))
			}
			for _, id := range open {
				w.add(fmt.Sprintf("task %d: two attempts not ended", id))
			}
		}
	}()
	go func() {
		defer w.wg.Done()
		for {
			select {
			case <-w.done:
				return
			default:
			}
			seen := map[string]int{}
			for _, pid := range c.quietOf(nil) {
				env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
				if err != nil {
					continue
				}
				for _, kv := range bytes.Split(env, []byte{0}) {
					if id, ok := bytes.CutPrefix(kv, []byte("DAMA_ETL_CONTEXT_ID=")); ok {
						seen[string(id)]++
					}
				}
			}
			w.procSamples.Add(1)
			for id, n := range seen {
				if n > 1 {
					w.add(fmt.Sprintf("task %s: %d commands running", id, n))
				}
			}
			// A pace, not a wait: a scan of /proc with thousands of
			// processes takes a good part of a core; the flocks catch
			// what falls between.
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return w
}

func (w *watcher) add(v string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, v)
}

func (w *watcher) stop() {
	w.stopOnce.Do(func() { close(w.done); w.wg.Wait(); w.ended = time.Now() })
}

// check fails the test on any violation seen, or written by a command.
func (w *watcher) check(c *cluster) {
	if data, err := os.ReadFile(filepath.Join(c.lockDir, "violations")); err == nil {
		for line := range strings.Lines(string(data)) {
			w.add(strings.TrimSpace(line))
		}
	}
	if len(w.violations) > 0 {
		c.tb.Fatalf("two attempts of a task at once (%d findings): %s", len(w.violations), strings.Join(w.violations[:min(len(w.violations), 20)], "; "))
	}
}

func (w *watcher) String() string {
	every := func(n int64) float64 { return scalebench.Millis(w.ended.Sub(w.began)) / float64(max(n, 1)) }
	return fmt.Sprintf("%d server samples over %.0f s (one every %.0f ms; asked every 10 ms), %d of the processes (one every %.0f ms), no command found its task's flock taken",
		w.serverSamples.Load(), w.ended.Sub(w.began).Seconds(), every(w.serverSamples.Load()), w.procSamples.Load(), every(w.procSamples.Load()))
}

// settle tells every quiet command to exit, and waits until every task is
// DONE with its River job completed: nothing reported is lost.
func (c *cluster) settle() {
	tb, ctx := c.tb, context.Background()
	var releasedAt time.Time
	if err := c.mon.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&releasedAt); err != nil {
		tb.Fatal(err)
	}
	signalled := 0
	for _, pid := range c.quietOf(nil) {
		if syscall.Kill(pid, syscall.SIGUSR1) == nil {
			signalled++
		}
	}
	// The fallback for a command not found (it looks once a minute).
	if err := os.WriteFile(c.release, nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	// Every command running at the release exits 0: an attempt of then
	// that did not end DONE lost what its command reported (and its task
	// ran the command again). Counted as the tasks settle, so that a wait
	// that times out says it too.
	lost := func() (int, string) {
		var n int
		var examples string
		if err := c.mon.QueryRow(ctx, `
			SELECT count(*), coalesce(string_agg(a.etl_context_id || ' attempt ' || a.attempt || ' on ' || a.host || ': ' || coalesce(e.payload->>'reason', a.outcome), '; ') FILTER (WHERE a.n <= 5), '')
			  FROM (SELECT *, row_number() OVER (ORDER BY etl_context_id) AS n FROM data_manager.etl_attempts
			         WHERE started_at < $1 AND ended_at >= $1 AND outcome IS DISTINCT FROM 'DONE') AS a
			  LEFT JOIN data_manager.event_store AS e ON e.etl_context_id = a.etl_context_id AND e.run_id = a.run_id AND e.type LIKE '%:ERROR'`, releasedAt).Scan(&n, &examples); err != nil {
			tb.Fatal(err)
		}
		return n, examples
	}
	began := time.Now()
	var total int
	testenv.Eventually(tb, 5*time.Minute, "every quiet task DONE with its job completed", func() (bool, error) {
		var settled int
		if err := c.mon.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE c.etl_status = 'DONE' AND j.state = 'completed')
			  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.kind = $1`, quietKind).Scan(&total, &settled); err != nil {
			tb.Fatal(err)
		}
		if settled == total {
			return true, nil
		}
		n, examples := lost()
		return false, fmt.Errorf("%d of %d DONE with their job completed; %d attempts running at the release ended without DONE (e.g. %s)", settled, total, n, examples)
	})
	var attempts string
	if err := c.mon.QueryRow(ctx, `
		SELECT string_agg(n || ' with ' || attempt || CASE attempt WHEN 1 THEN ' attempt' ELSE ' attempts' END, ', ' ORDER BY attempt) FROM (
		  SELECT attempt, count(*) AS n FROM data_manager.etl_contexts WHERE kind = $1 GROUP BY 1) AS a`, quietKind).Scan(&attempts); err != nil {
		tb.Fatal(err)
	}
	c.say("released %d commands: all %d tasks DONE with their job completed %.1f s later (%s)", signalled, total, time.Since(began).Seconds(), attempts)
	if n, examples := lost(); n > 0 {
		tb.Errorf("%d attempts whose command exited 0 at the release did not end DONE: their outcome was lost and their task ran again; e.g. %s", n, examples)
	}
}
