package config_test

import (
	"fmt"

	"github.com/dama-etl/dama/config"
)

// A configuration names the queues with their limits and the kinds of task a
// supervisor may run; fields left out take their defaults.
func ExampleParse() {
	cfg, err := config.Parse([]byte(`
log_dir: /var/lib/dama/logs
poll_interval: 5s
queues:
  etl: { max_running: 4 }
kinds:
  conflation:
    queue: etl
    command: ["/opt/etl/conflation", "--verbose"]
    max_attempts: 3
  cleanup:
    command: ["/opt/etl/cleanup"]
`))
	if err != nil {
		panic(err)
	}
	for _, name := range cfg.KindNames() {
		k, _ := cfg.Kind(name)
		fmt.Printf("%s: queue %s (max_running %d), %d attempts, %v\n", name, k.Queue, cfg.Queues[k.Queue].MaxRunning, k.MaxAttempts, k.Command)
	}
	// Output:
	// cleanup: queue default (max_running 10), 3 attempts, [/opt/etl/cleanup]
	// conflation: queue etl (max_running 4), 3 attempts, [/opt/etl/conflation --verbose]
}

// Days-long kinds hold their lock in advisory mode: one connection per task
// and no transaction left open. The top-level lock_mode is every kind's
// default.
func ExampleConfig_LockModeOf() {
	cfg, err := config.Parse([]byte(`
log_dir: /var/lib/dama/logs
lock_mode: row
kinds:
  nightly:
    command: ["/opt/etl/nightly"]
  backfill:
    command: ["/opt/etl/backfill"]
    lock_mode: advisory
`))
	if err != nil {
		panic(err)
	}
	for _, name := range cfg.KindNames() {
		k, _ := cfg.Kind(name)
		mode := cfg.LockModeOf(k)
		fmt.Printf("%s: %s, %d connections per task\n", name, mode, mode.ConnectionsPerTask())
	}
	// Output:
	// backfill: advisory, 1 connections per task
	// nightly: row, 2 connections per task
}
