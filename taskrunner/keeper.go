package taskrunner

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/keeper"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/protocol"
)

// The application names of a lock keeper's connections (pg_stat_activity).
const (
	KeeperLockName = "dama-keeper-lock"
	KeeperPoolName = "dama-keeper-pool"
)

const (
	// KeeperPoolSize bounds the connections a lock keeper opens for the
	// statements of the task processes it serves, beside its lock session.
	KeeperPoolSize = 4
	// KeeperConnections is how many server connections a host's lock
	// keeper holds at most: its lock session and its pool.
	KeeperConnections = KeeperPoolSize + 1
)

// keeperDir holds the lock keepers' sockets of the task processes logging in logDir.
func keeperDir(logDir string) string { return filepath.Join(logDir, ".keeper") }

// KeeperSocket is the socket of the lock keeper serving the task processes
// that log in logDir and were handed secret (protocol.Secrets.Keeper): one
// per supervisor's start, host, log directory and keeper protocol version.
// Its name, a hash of the secret, shows nothing of it or of the database.
func KeeperSocket(logDir string, secret []byte) string {
	sum := sha256.Sum256(append([]byte("dama lock keeper socket\x00"), secret...))
	return keeper.SocketPath(keeperDir(logDir), hex.EncodeToString(sum[:8])+"-v"+strconv.Itoa(keeper.Version))
}

// dialKeeper opens a session with the host's lock keeper, started if none serves.
func (r *runner) dialKeeper(ctx context.Context) (dbConn, error) {
	switch {
	case r.opts.RunKey == "":
		return nil, errors.New("lock_mode host needs the run's key, which the supervisor did not give")
	case len(r.opts.KeeperSecret) == 0:
		return nil, errors.New("lock_mode host needs the keeper's secret, which the supervisor did not give")
	}
	if err := keeper.Dir(keeperDir(r.opts.Config.LogDir)); err != nil {
		return nil, err
	}
	socket := KeeperSocket(r.opts.Config.LogDir, r.opts.KeeperSecret)
	conn, err := keeper.Dial(ctx, socket, r.opts.KeeperSecret, r.opts.ContextID, r.opts.RunKey, func() error {
		return r.startKeeper(socket)
	})
	if err != nil {
		return nil, err
	}
	return keeperConn{conn}, nil
}

// startKeeper starts a lock keeper on socket, in a session of its own: the
// runner's child but not its command's, left running when the runner ends.
func (r *runner) startKeeper(socket string) error {
	logFile, err := os.OpenFile(strings.TrimSuffix(socket, ".sock")+".log", os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("open the keeper's log: %w", err)
	}
	defer logFile.Close()
	env, secrets := keeperEnv(r.opts.DatabaseURL, os.Environ())
	secrets.Keeper = r.opts.KeeperSecret
	secretsR, err := protocol.SecretsSocket(secrets)
	if err != nil {
		return fmt.Errorf("hand the keeper its secrets: %w", err)
	}
	defer secretsR.Close()
	launch := protocol.KeeperLaunch{Socket: socket, Heartbeat: time.Duration(r.opts.Config.HeartbeatInterval), SecretsFD: protocol.KeeperSecretsFD}
	cmd := exec.Command(selfExe, launch.Args()...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{secretsR}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := r.startKept(cmd); err != nil {
		return err
	}
	r.logger.Info("started a lock keeper", "pid", cmd.Process.Pid, "socket", socket)
	// Reaped with the runner's other children (reapOrphans, killTree).
	return cmd.Process.Release()
}

// startKept starts cmd, a keeper, and records it before killTree, which
// waits for r.keepersMu, can take it for a process of the command.
func (r *runner) startKept(cmd *exec.Cmd) error {
	r.keepersMu.Lock()
	defer r.keepersMu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	if r.keepers == nil {
		r.keepers = make(map[process]bool)
	}
	if st, err := hostproc.ReadStat(cmd.Process.Pid); err == nil {
		r.keepers[process{st.PID, st.StartTicks}] = true
	}
	return nil
}

// isKeeper reports whether p is a lock keeper the runner started.
func (r *runner) isKeeper(p process) bool {
	r.keepersMu.Lock()
	defer r.keepersMu.Unlock()
	return r.keepers[p]
}

// keeperEnv splits the runner's environment for a keeper: the database URL
// and libpq's PG* variables go on its secrets socket; the rest but DAMA_*
// (config.Withheld) in its environment (HOME, for libpq's password file).
func keeperEnv(url string, environ []string) (env []string, secrets protocol.Secrets) {
	env = []string{protocol.ProcessEnv + "=" + protocol.ProcessKeeper}
	secrets.Env = []string{protocol.DatabaseURLEnv + "=" + url}
	for _, kv := range environ {
		switch name, _, _ := strings.Cut(kv, "="); {
		case name == protocol.DatabaseURLEnv:
		case protocol.DatabaseVar(name):
			secrets.Env = append(secrets.Env, kv)
		case !config.Withheld(name):
			env = append(env, kv)
		}
	}
	return env, secrets
}

// KeeperOptions configure a lock keeper process (RunKeeper).
type KeeperOptions struct {
	DatabaseURL string                // from the secrets socket
	Secret      []byte                // protocol.Secrets.Keeper
	Launch      protocol.KeeperLaunch // what the task process that started the keeper said
	IdleExit    time.Duration         // how long it runs on without a session; 0: keeper.DefaultIdleExit
	Logger      *slog.Logger
}

// RunKeeper runs a lock keeper until it has had no session for a while,
// or SIGTERM, and returns the process exit code: 0, also when another
// keeper serves the socket already.
func RunKeeper(ctx context.Context, opts KeeperOptions) int {
	// It holds the database URL and its task processes' run keys: see Run.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP)
	logger := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	heartbeat := opts.Launch.Heartbeat
	pool, err := pgxpool.ParseConfig(opts.DatabaseURL)
	if err != nil {
		logger.Error("the lock keeper ends on an error", "error", fmt.Errorf("parse database URL: %w", err))
		return protocol.ExitSetup
	}
	pool.MaxConns = KeeperPoolSize
	pool.MinConns = 0
	pool.MaxConnIdleTime = time.Minute
	pool.ConnConfig.RuntimeParams["application_name"] = KeeperPoolName
	pgsession.ReadCommitted(pool.ConnConfig)
	setKeepalives(pool.ConnConfig, heartbeat)
	// Also run again on a connection the keeper resets once a session's
	// statement may have changed it (keeper.Serve).
	pool.AfterConnect = pgsession.KeepIdle
	err = keeper.Serve(ctx, keeper.Config{
		Socket: opts.Launch.Socket,
		Secret: opts.Secret,
		ConnectLock: func(ctx context.Context) (*pgx.Conn, error) {
			return connect(ctx, opts.DatabaseURL, "", KeeperLockName, heartbeat)
		},
		Pool:     pool,
		IdleExit: opts.IdleExit,
		Logger:   logger,
	})
	switch {
	case errors.Is(err, keeper.ErrRunning):
		logger.Info("another lock keeper serves the socket", "socket", opts.Launch.Socket)
		return 0
	case err != nil:
		logger.Error("the lock keeper ends on an error", "error", err)
		return protocol.ExitSetup
	}
	return 0
}
