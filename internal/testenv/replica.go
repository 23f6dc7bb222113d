package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewReplica makes a streaming replica of primary (pg_basebackup -R), on a
// port of its own, and makes the primary's commits synchronous on it: a
// commit returns once the replica has it, so that a failover to the
// replica loses no write that was acknowledged. It is stopped and removed
// when t ends.
func NewReplica(t testing.TB, primary *Server) *Server {
	t.Helper()
	r := &Server{bindir: primary.bindir, runAs: primary.runAs}
	var err error
	r.dir, err = os.MkdirTemp("", "dama-pgreplica-")
	if err != nil {
		t.Fatalf("create replica directory: %v", err)
	}
	t.Cleanup(func() { r.cleanup(t) })
	if err := os.Chmod(r.dir, 0o755); err != nil {
		t.Fatalf("chmod replica directory: %v", err)
	}
	if r.runAs != "" {
		uid, gid, err := lookupUser(r.runAs)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(r.dir, uid, gid); err != nil {
			t.Fatalf("chown replica directory to %s: %v", r.runAs, err)
		}
	}
	if out, err := r.run(filepath.Join(r.bindir, "pg_basebackup"), "-D", r.dataDir(), "-R", "-X", "stream", "-c", "fast",
		"-h", "127.0.0.1", "-p", fmt.Sprint(primary.port), "-U", "postgres"); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// The copy holds the primary's settings: its own socket directory, and
	// a name the primary's synchronous_standby_names can give. After the
	// primary restarts, the replica streams again within 100ms rather than
	// the default 5s, through which every commit on the primary waits for
	// it: a restart keeps writes away for as long as it lasts, as a test
	// timing a restart against reconnect_grace counts on.
	if err := r.writeFile(r.confPath(), fmt.Sprintf("\nunix_socket_directories = '%s'\ncluster_name = 'replica'\nwal_retrieve_retry_interval = '100ms'\n", r.dir), true); err != nil {
		t.Fatalf("configure replica: %v", err)
	}
	r.startOnFreePort(t)

	if err := primary.writeFile(primary.confPath(), "\nsynchronous_commit = on\nsynchronous_standby_names = 'replica'\n", true); err != nil {
		t.Fatalf("configure primary: %v", err)
	}
	if out, err := primary.run(filepath.Join(primary.bindir, "pg_ctl"), "-D", primary.dataDir(), "reload"); err != nil {
		t.Fatalf("reload primary: %v\n%s", err, out)
	}
	Eventually(t, time.Minute, "the replica to stream synchronously", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, primary.URL())
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		var sync bool
		err = conn.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_replication
			                WHERE application_name = 'replica' AND state = 'streaming' AND sync_state = 'sync')`).Scan(&sync)
		return sync, err
	})
	return r
}

// Promote makes the replica a primary (pg_ctl promote), and waits until it
// takes writes.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	if out, err := s.run(filepath.Join(s.bindir, "pg_ctl"), "-D", s.dataDir(), "-w", "-t", "60", "promote"); err != nil {
		t.Fatalf("promote: %v\n%s", err, out)
	}
}

// FailoverURL names the database of url on both primary and replica, for
// a client that must find whichever takes writes (libpq's and pgx's
// target_session_attrs=read-write).
func FailoverURL(t testing.TB, url string, primary, replica *Server) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		primary.port, replica.port, cfg.Database)
}
