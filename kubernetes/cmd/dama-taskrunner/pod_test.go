package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/taskrunner"
)

func TestOnlyAVerifiedOrAddressedServerIsSurelyTheDatabase(t *testing.T) {
	for url, want := range map[string]bool{
		"postgres://etl@db.example/etl?sslmode=disable":                  false,
		"postgres://etl@db.example/etl?sslmode=require":                  false,
		"postgres://etl@db.example/etl?sslmode=prefer":                   false,
		"postgres://etl@db.example/etl":                                  false,
		"postgres://etl@db.example/etl?sslmode=verify-full":              true,
		"postgres://etl@10.0.0.7:5432/etl?sslmode=disable":               true,
		"postgres://etl@[fd00::7]:5432/etl":                              true,
		"postgres://etl@10.0.0.7,db.example/etl?sslmode=disable":         false,
		"host=/var/run/postgresql dbname=etl":                            true,
		"host=db.example dbname=etl sslmode=verify-full":                 true,
		"postgres://etl@db.example/etl?sslmode=verify-full&sslrootcert=": true,
	} {
		if got := surelyTheServer(url); got != want {
			t.Errorf("%s: %t, want %t", url, got, want)
		}
	}
}

// A pod's task process refuses a shim socket that is not an absolute path,
// and host lock mode, whose lock a pod's keeper would hold elsewhere,
// before it listens.
func TestAPodsTaskProcessRefusesWhatAPodCannotHave(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		socket string
		mode   config.LockMode
		want   string
	}{
		{"shim.sock", config.LockModeRow, "want an absolute path"},
		{filepath.Join(dir, "shim.sock"), config.LockModeHost, "holds its own lock"},
	} {
		var log bytes.Buffer
		p := &podStarter{socket: c.socket}
		opts := taskrunner.Options{LockMode: c.mode}
		if p.Attach(opts, slog.New(slog.NewTextHandler(&log, nil)), nil) || !strings.Contains(log.String(), c.want) {
			t.Errorf("socket %q in lock mode %s: attached, or logged %q", c.socket, c.mode, log.String())
		}
		if _, err := os.Stat(c.socket); err == nil {
			t.Errorf("socket %q in lock mode %s: listened", c.socket, c.mode)
		}
	}
}
