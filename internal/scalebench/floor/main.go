// Command floor is the fork/exec floor of the scale benchmark: what any task
// process must do before it holds its lock, and nothing else. It connects to
// DATABASE_URL, takes pg_try_advisory_lock(key, ID) for the ID in its
// argument, writes one byte on fd 3 (a readiness pipe, as a task process
// reports to its supervisor) and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// key is the first half of the advisory lock's key: not dama's namespace,
// although the benchmark runs this in a database of its own anyway.
const key = 1684106600

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: floor ID (DATABASE_URL in the environment)")
	}
	id, err := strconv.ParseInt(os.Args[1], 10, 32)
	if err != nil {
		return fmt.Errorf("ID %q: %w", os.Args[1], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2::int)`, key, id).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("advisory lock (%d, %d) is held", key, id)
	}
	ready := os.NewFile(3, "ready")
	if _, err := ready.Write([]byte{1}); err != nil {
		return fmt.Errorf("report readiness: %w", err)
	}
	return ready.Close()
}
