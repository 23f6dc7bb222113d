package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Secrets is what a task process is handed that no other process of its
// user may read: never in its environment or its arguments, which such a
// process can read in /proc in the task process's first milliseconds,
// before it has made itself non-dumpable, but on a socket it reads after
// (Launch.SecretsFD, KeeperLaunch.SecretsFD). A supervisor hands them to
// its runners, a runner to the lock keeper it starts.
type Secrets struct {
	// Env holds the variables a task process connects to the database
	// with: DatabaseURLEnv and libpq's PG* variables, each "NAME=value".
	// A command gets one only when its kind names it in pass_env.
	Env []string
	// RunKey is the key of the run the task process is (etlcontext.Run),
	// empty for a keeper.
	RunKey string
	// Keeper is the secret that the task processes of one supervisor and
	// their host's lock keeper prove to each other (internal/keeper): random,
	// made by the supervisor when it starts.
	Keeper []byte
}

// MaxSecrets bounds the encoding of Secrets: well within a socket's
// buffer, so that they are written whole before their reader starts.
const MaxSecrets = 16 << 10

// String, GoString and LogValue show no secret: a Secrets printed or
// logged, alone or in a struct (supervisor.Launch), says only that it is
// there.
func (Secrets) String() string       { return "[secrets]" }
func (Secrets) GoString() string     { return "[secrets]" }
func (Secrets) LogValue() slog.Value { return slog.StringValue("[secrets]") }

// Encode returns s as a pod's secrets file holds them (Launch.SecretsFile).
func (s Secrets) Encode() ([]byte, error) { return s.encode() }

// ReadPodFiles reads a pod's secrets file (Launch.SecretsFile) and its
// configuration's, and checks them against the digest its supervisor put
// in the pod's spec (Launch.SecretsDigest, PodDigest): a Secret of the
// pod's name that someone else made before the supervisor did is not
// run. It returns the secrets and the configuration's bytes. Call it once
// the process is non-dumpable and untraced.
func ReadPodFiles(secretsPath, configPath, digest string) (Secrets, []byte, error) {
	secrets, err := readBounded(secretsPath, MaxSecrets)
	if err != nil {
		return Secrets{}, nil, fmt.Errorf("read the secrets: %w", err)
	}
	cfg, err := readBounded(configPath, MaxPodConfig)
	if err != nil {
		return Secrets{}, nil, fmt.Errorf("read the configuration: %w", err)
	}
	if PodDigest(secrets, cfg) != digest {
		return Secrets{}, nil, errors.New("the pod's secrets and configuration are not its supervisor's (their digest differs): someone else made the pod's Secret")
	}
	s, err := parseSecrets(secrets)
	return s, cfg, err
}

// MaxPodConfig bounds a pod's configuration file: a Secret holds 1 MiB.
const MaxPodConfig = 1 << 20

// PodDigest is the digest of a pod's secrets and configuration, which
// its supervisor puts in the pod's spec (Launch.SecretsDigest).
func PodDigest(secrets, config []byte) string {
	a, b := sha256.Sum256(secrets), sha256.Sum256(config)
	sum := sha256.Sum256(append(a[:], b[:]...))
	return hex.EncodeToString(sum[:])
}

// readBounded reads the file at path, refusing one over limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s: over %d bytes", path, limit)
	}
	return b, err
}

// encode returns s as the bytes parseSecrets reads: NUL-terminated
// fields, which hold any bytes a process's environment can (JSON would
// mangle a password that is not UTF-8): the run key, the keeper's secret
// in hexadecimal, then each variable.
func (s Secrets) encode() ([]byte, error) {
	var b []byte
	for _, f := range append([]string{s.RunKey, hex.EncodeToString(s.Keeper)}, s.Env...) {
		if strings.IndexByte(f, 0) >= 0 {
			return nil, errors.New("encode the secrets: a NUL byte in one")
		}
		b = append(append(b, f...), 0)
	}
	if len(b) > MaxSecrets {
		return nil, fmt.Errorf("the secrets are %d bytes, over %d: is the environment's PG* or the database URL that long?", len(b), MaxSecrets)
	}
	return b, nil
}

// parseSecrets reads what encode wrote.
func parseSecrets(b []byte) (Secrets, error) {
	if len(b) > MaxSecrets {
		return Secrets{}, fmt.Errorf("the secrets: %d bytes, over %d", len(b), MaxSecrets)
	}
	fields := strings.Split(string(b), "\x00")
	if len(fields) < 3 || fields[len(fields)-1] != "" {
		return Secrets{}, errors.New("the secrets: not the NUL-terminated fields of dama's task processes")
	}
	fields = fields[:len(fields)-1]
	keeper, err := hex.DecodeString(fields[1])
	if err != nil {
		return Secrets{}, fmt.Errorf("the secrets: the keeper's: %w", err)
	}
	s := Secrets{RunKey: fields[0], Env: fields[2:]}
	if len(keeper) > 0 {
		s.Keeper = keeper
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	for _, kv := range s.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return Secrets{}, fmt.Errorf("the secrets: %q is not NAME=value", name)
		}
	}
	return s, nil
}

// ReadSecrets reads the secrets on fd, a socket whose other end wrote
// them whole and closed (SecretsSocket), and closes it. Call it once the
// process is non-dumpable and untraced.
func ReadSecrets(fd int) (Secrets, error) {
	f := os.NewFile(uintptr(fd), "secrets")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSecrets+1))
	if err != nil {
		return Secrets{}, fmt.Errorf("read the secrets: %w", err)
	}
	return parseSecrets(b)
}

// SecretsSocket returns one end of a socket pair that holds s, for a process
// to be started with it (Launch.SecretsFD, KeeperLaunch.SecretsFD), which
// reads it once non-dumpable (ReadSecrets): s is written whole, and the
// other end closed, before it starts. A socket, not a pipe: another
// process of the user may open a pipe through /proc/<pid>/fd in the
// reader's first milliseconds, and read the secrets first, but not a
// socket.
func SecretsSocket(s Secrets) (*os.File, error) {
	b, err := s.encode()
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create the secrets' socket: %w", err)
	}
	// A socket's buffer (over 200 KiB by default) holds them whole.
	n, err := unix.Write(fds[0], b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	unix.Close(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, fmt.Errorf("write the secrets: %w", err)
	}
	return os.NewFile(uintptr(fds[1]), "secrets"), nil
}
