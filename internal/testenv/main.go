package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/sql"
)

// binDirEnv carries the directory of the built binaries from Main to New.
const binDirEnv = "DAMA_TEST_BIN_DIR"

// Main builds the binaries (unless DAMA_TEST_BIN_DIR names them) and the
// migrated template database, runs the package's tests, and removes
// both. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// A fuzz worker only tries a fuzz target's inputs, none of which starts
	// a process; building the binaries again in each worker would spend a
	// short -fuzztime before the first input.
	if slices.Contains(os.Args[1:], "-test.fuzzworker") {
		return m.Run()
	}
	if gorace := os.Getenv("GORACE"); raceEnabled && !strings.Contains(gorace, "atexit_sleep_ms") {
		// A program built with the race detector sleeps a second before it
		// exits (atexit_sleep_ms, 1000 by default), so that another
		// thread's report is printed whole: every dama command a test
		// runs, and every task process, took 1.1 s instead of 0.12 s.
		os.Setenv("GORACE", strings.TrimSpace(gorace+" atexit_sleep_ms=0"))
	}
	if os.Getenv(binDirEnv) == "" {
		dir, err := os.MkdirTemp("", "dama-test-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 2
		}
		defer os.RemoveAll(dir)
		if err := Build(dir); err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 2
		}
		os.Setenv(binDirEnv, dir)
	}
	if os.Getenv(pgdataEnv) == "" {
		dir, err := os.MkdirTemp("", "dama-pgdata-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 2
		}
		defer os.RemoveAll(dir)
		// The servers' user passes through to the template.
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 2
		}
		os.Setenv(pgdataEnv, dir)
	}
	if admin := os.Getenv("TEST_DATABASE_URL"); admin != "" {
		name, err := createTemplate(admin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 2
		}
		defer dropDatabase(admin, name)
		os.Setenv(templateEnv, name)
	}
	return m.Run()
}

// Build builds the binaries the tests run into dir, static as
// scripts/build.sh builds them, and, when the tests have the race
// detector, again with it into dir/race (see Env.WithRaceDetector).
// scripts/test.sh builds them once for every package's tests
// (DAMA_TEST_BIN_DIR), rather than each package's TestMain.
func Build(dir string) error {
	if err := build(dir, false); err != nil {
		return err
	}
	if raceEnabled {
		return build(filepath.Join(dir, raceDir), true)
	}
	return nil
}

// raceDir is where, below the binaries' directory, those built with the
// race detector are.
const raceDir = "race"

func build(dir string, race bool) error {
	// dama and dama-taskrunner are the module's own (the Kubernetes
	// module's dama runs pods too), the rest the core module's, but for
	// the shim of a pod's task container: the Kubernetes module's, built
	// where it is there.
	pkgs := []string{"./cmd/dama", "./cmd/dama-taskrunner", "github.com/dama-etl/dama/cmd/sample-etl", "github.com/dama-etl/dama/cmd/sample-embedded"}
	if _, err := os.Stat(filepath.Join(moduleRoot(), "cmd", "dama-shim")); err == nil {
		pkgs = append(pkgs, "./cmd/dama-shim")
	}
	for _, pkg := range pkgs {
		args := []string{"build", "-o", filepath.Join(dir, filepath.Base(pkg))}
		if commit := headCommit(); commit != "" {
			args = append(args, "-ldflags", "-X github.com/dama-etl/dama/version.commit="+commit)
		}
		cmd := exec.Command("go", args...)
		if race {
			cmd.Args = append(cmd.Args, "-race")
		} else {
			// Static, as scripts/build.sh builds them: the tests measure
			// what users run. (The race detector needs cgo.)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		cmd.Args = append(cmd.Args, pkg)
		cmd.Dir = moduleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

// pgdataEnv names the directory where the first private server's test
// leaves a data directory fresh from initdb, for the others to copy
// (Server.initData).
const pgdataEnv = "DAMA_TEST_PGDATA"

// templateEnv carries the name of the migrated template database from Main
// to New: a test's database is a copy of it, made in a fraction of the time
// the migrations take.
const templateEnv = "DAMA_TEST_TEMPLATE"

// createTemplate creates a database on the server admin names, migrates it
// and returns its name.
func createTemplate(admin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := "dama_template_" + randomHex(6)
	if err := execAdmin(ctx, admin, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create the template database: %w", err)
	}
	dbURL, err := withDatabase(admin, name)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("connect to the template database: %w", err)
	}
	// A database is copied only while nobody is connected to it.
	defer pool.Close()
	if err := sql.Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		return "", fmt.Errorf("migrate the template database: %w", err)
	}
	return name, nil
}

func dropDatabase(admin, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execAdmin(ctx, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: drop the template database:", err)
	}
}

func execAdmin(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to the test server: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// headCommit is the commit the module's checkout is at, "" when unknown.
func headCommit() string {
	cmd := exec.Command("git", "rev-parse", "HEAD")
	cmd.Dir = moduleRoot()
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		panic(fmt.Sprintf("testenv: go env GOMOD: %v", err))
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
