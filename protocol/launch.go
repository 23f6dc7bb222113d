package protocol

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strconv"
	"time"
)

// Subcommand is the first argument of a runner's command line: a runner
// shows as "dama taskrunner --context-id 42 ..." in a process listing.
const Subcommand = "taskrunner"

// Launch is what a supervisor tells the runner it starts, on its command
// line.
type Launch struct {
	// ContextID is the context to run.
	ContextID int64
	// RunID is the run id the supervisor prepared for this launch.
	RunID string
	// LockMode is how to hold the lock (the kind's lock_mode).
	LockMode LockMode
	// ReadyFD, when above 0, is a descriptor to write one byte to once the
	// lock is held.
	ReadyFD int
	// SecretsFD, when above 0, is a socket to read the runner's Secrets
	// from, once it is non-dumpable: the database URL and libpq's PG*
	// variables, the run's key, which the runner sets in each of its
	// sessions (as a member of dama_task, it may write only its own run's
	// rows), and the keeper's secret. The runner closes it once read, so
	// neither the command nor a function process inherits it. Without
	// one, a runner started by hand connects with its environment.
	SecretsFD int
	// SecretsFile, when set, is a file to read the Secrets from, as
	// Secrets.Encode wrote them, once the process is non-dumpable: a
	// pod's, where a Secret that only dama's container mounts holds them.
	SecretsFile string
	// SecretsDigest, required with SecretsFile, is PodDigest of the
	// secrets file and the configuration's: the task process runs only
	// the launch its supervisor made.
	SecretsDigest string
	// LogDir, when set, is the directory of the task's log file, over the
	// configuration's log_dir: a volume of the task process's own (a
	// pod's).
	LogDir string
	// CgroupParent, when set, is the control group under which the
	// attempt's processes get a group of their own, named by its run
	// (config.Config.CgroupParent, as the supervisor found it usable).
	CgroupParent string
}

// The descriptors a supervisor hands the task process it launches, after
// stdin, stdout and stderr: the ready pipe, then the secrets socket.
const (
	ReadyFD   = 3
	SecretsFD = 4
)

// Args returns the runner's command line after the program name.
func (l Launch) Args() []string {
	args := []string{Subcommand,
		"--context-id", strconv.FormatInt(l.ContextID, 10),
		"--run-id", l.RunID,
		"--lock-mode", string(l.LockMode)}
	if l.ReadyFD > 0 {
		args = append(args, "--ready-fd", strconv.Itoa(l.ReadyFD))
	}
	if l.SecretsFD > 0 {
		args = append(args, "--secrets-fd", strconv.Itoa(l.SecretsFD))
	}
	if l.SecretsFile != "" {
		args = append(args, "--secrets-file", l.SecretsFile, "--secrets-digest", l.SecretsDigest)
	}
	if l.LogDir != "" {
		args = append(args, "--log-dir", l.LogDir)
	}
	if l.CgroupParent != "" {
		args = append(args, "--cgroup-parent", l.CgroupParent)
	}
	return args
}

// ParseLaunch reads the arguments that follow Subcommand.
func ParseLaunch(args []string) (Launch, error) {
	var (
		l        Launch
		lockMode string
	)
	fs := flag.NewFlagSet(Subcommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int64Var(&l.ContextID, "context-id", 0, "etl_context_id to run")
	fs.StringVar(&l.RunID, "run-id", "", "run id prepared by the supervisor")
	fs.IntVar(&l.ReadyFD, "ready-fd", 0, "descriptor to write one byte to once the lock is held")
	fs.IntVar(&l.SecretsFD, "secrets-fd", 0, "descriptor to read the secrets from")
	fs.StringVar(&lockMode, "lock-mode", "", "how to hold the lock: row (the default), advisory or host")
	fs.StringVar(&l.SecretsFile, "secrets-file", "", "file to read the secrets from")
	fs.StringVar(&l.SecretsDigest, "secrets-digest", "", "digest of the secrets file and the configuration's")
	fs.StringVar(&l.LogDir, "log-dir", "", "directory of the task's log file, over the configuration's")
	fs.StringVar(&l.CgroupParent, "cgroup-parent", "", "control group to make the attempt's group under")
	if err := fs.Parse(args); err != nil {
		return Launch{}, fmt.Errorf("%s arguments: %w", Subcommand, err)
	}
	switch {
	case l.SecretsFile != "" && l.SecretsFD > 0:
		return Launch{}, errors.New("--secrets-file and --secrets-fd: the secrets come from one")
	case (l.SecretsFile != "") != (l.SecretsDigest != ""):
		return Launch{}, errors.New("--secrets-file and --secrets-digest go together")
	case l.LogDir != "" && !filepath.IsAbs(l.LogDir):
		return Launch{}, fmt.Errorf("--log-dir %q: want an absolute path", l.LogDir)
	case l.CgroupParent != "" && (!path.IsAbs(l.CgroupParent) || path.Clean(l.CgroupParent) != l.CgroupParent):
		return Launch{}, fmt.Errorf("--cgroup-parent %q: want a clean absolute path", l.CgroupParent)
	}
	if fs.NArg() > 0 {
		return Launch{}, fmt.Errorf("%s arguments: unexpected %q", Subcommand, fs.Arg(0))
	}
	if err := checkFD("--ready-fd", l.ReadyFD); err != nil {
		return Launch{}, err
	}
	if err := checkFD("--secrets-fd", l.SecretsFD); err != nil {
		return Launch{}, err
	}
	if l.ReadyFD > 0 && l.ReadyFD == l.SecretsFD {
		// The secrets' descriptor is closed once read: its number would be
		// another file's by the time the lock is held.
		return Launch{}, errors.New("--ready-fd and --secrets-fd name the same descriptor")
	}
	l.LockMode = LockMode(cmp.Or(lockMode, string(LockModeRow)))
	if !l.LockMode.Valid() {
		return Launch{}, fmt.Errorf("--lock-mode %q: want %q, %q or %q", l.LockMode, LockModeRow, LockModeAdvisory, LockModeHost)
	}
	if err := l.validate(); err != nil {
		return Launch{}, err
	}
	return l, nil
}

// validate checks what a launch names: its context, run and lock mode.
func (l Launch) validate() error {
	switch {
	case l.ContextID <= 0:
		return errors.New("--context-id is required: a positive etl_context_id")
	case l.RunID == "":
		return errors.New("--run-id is required")
	case !l.LockMode.Valid():
		return fmt.Errorf("--lock-mode %q: want %q, %q or %q", l.LockMode, LockModeRow, LockModeAdvisory, LockModeHost)
	}
	return nil
}

// checkFD checks a descriptor flag: above 2 (not stdio), or 0 for none.
func checkFD(flag string, fd int) error {
	if fd < 0 || (fd > 0 && fd < 3) {
		return fmt.Errorf("%s %d: want a descriptor above 2, or none", flag, fd)
	}
	return nil
}

// KeeperSubcommand is the first argument of a lock keeper's command line.
const KeeperSubcommand = "keeper"

// KeeperLaunch is what a task process tells the lock keeper it starts, on
// its command line.
type KeeperLaunch struct {
	// Socket is the path the keeper listens on.
	Socket string
	// Heartbeat is the configuration's heartbeat_interval: how the keeper
	// probes its connections.
	Heartbeat time.Duration
	// SecretsFD is a socket to read the keeper's Secrets from, once it is
	// non-dumpable: the database URL and libpq's PG* variables, and the
	// secret it proves to its task processes. A socket, not the environment:
	// a process of the same user could read the keeper's environment
	// before it is non-dumpable, and may kill it to have it started again.
	SecretsFD int
}

// KeeperSecretsFD is the descriptor a task process hands the keeper it
// starts, after stdin, stdout and stderr.
const KeeperSecretsFD = 3

// Args returns the keeper's command line after the program name.
func (l KeeperLaunch) Args() []string {
	args := []string{KeeperSubcommand, "--socket", l.Socket, "--heartbeat", l.Heartbeat.String()}
	if l.SecretsFD > 0 {
		args = append(args, "--secrets-fd", strconv.Itoa(l.SecretsFD))
	}
	return args
}

// ParseKeeperLaunch reads the arguments that follow KeeperSubcommand.
func ParseKeeperLaunch(args []string) (KeeperLaunch, error) {
	var l KeeperLaunch
	fs := flag.NewFlagSet(KeeperSubcommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&l.Socket, "socket", "", "path of the keeper's socket")
	fs.DurationVar(&l.Heartbeat, "heartbeat", 0, "heartbeat_interval")
	fs.IntVar(&l.SecretsFD, "secrets-fd", 0, "descriptor to read the secrets from")
	if err := fs.Parse(args); err != nil {
		return KeeperLaunch{}, fmt.Errorf("%s arguments: %w", KeeperSubcommand, err)
	}
	switch {
	case fs.NArg() > 0:
		return KeeperLaunch{}, fmt.Errorf("%s arguments: unexpected %q", KeeperSubcommand, fs.Arg(0))
	case l.Socket == "" || !filepath.IsAbs(l.Socket):
		return KeeperLaunch{}, errors.New("--socket is required: an absolute path")
	case l.Heartbeat <= 0:
		return KeeperLaunch{}, errors.New("--heartbeat is required: a positive duration")
	case l.SecretsFD < 3:
		return KeeperLaunch{}, fmt.Errorf("--secrets-fd %d: want a descriptor above 2", l.SecretsFD)
	}
	return l, nil
}

// LockNamespace is the first key of the advisory lock a task process holds
// (the second is its context's id); it spells 'dama'. Key 0, which no
// context id takes, serializes `dama migrate`.
const LockNamespace = 1684106593
