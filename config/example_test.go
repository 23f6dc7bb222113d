package config_test

import (
	"fmt"
	"time"

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
func ExampleLockMode() {
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
		mode := k.LockMode
		fmt.Printf("%s: %s, %d connections per task\n", name, mode, mode.ConnectionsPerTask())
	}
	// Output:
	// backfill: advisory, 1 connections per task
	// nightly: row, 2 connections per task
}

// A periodic kind's schedule in its time zone: Next gives the coming tick,
// and Latest the one tick a supervisor starts for all those missed while
// none ran.
func ExampleParseSchedule() {
	s, err := config.ParseSchedule("30 2 * * *", "Europe/Paris")
	if err != nil {
		panic(err)
	}
	lastRun := time.Date(2026, 11, 19, 1, 30, 0, 0, time.UTC)
	now := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	fmt.Println("next:", s.Next(now).UTC())
	fmt.Println("after three missed nights, one run for:", s.Latest(lastRun, now).UTC())
	// Output:
	// next: 2026-11-23 01:30:00 +0000 UTC
	// after three missed nights, one run for: 2026-11-22 01:30:00 +0000 UTC
}

// A Config built in Go is given its defaults and checked as a parsed one
// is: WithDefaults fills in what is unset, Validate refuses what is wrong.
func ExampleConfig_WithDefaults() {
	cfg := (&config.Config{
		LogDir: "/var/lib/dama/logs",
		Kinds: map[string]config.Kind{
			"nightly": {Command: []string{"/opt/etl/nightly"}, Retry: &config.RetryPolicy{Backoff: config.BackoffFixed}},
		},
	}).WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	k, _ := cfg.Kind("nightly")
	fmt.Println(cfg.PollInterval, *cfg.ReconnectGrace, k.Queue, k.MaxAttempts, k.LockMode, *k.KillGrace, k.RetryDelay(2))

	bad := &config.Config{LogDir: "/l", Kinds: map[string]config.Kind{"x": {Command: []string{"x"}, MaxRunning: -1}}}
	fmt.Println(bad.WithDefaults().Validate())
	// Output:
	// 5s 2m0s default 3 row 10s 1m0s
	// kind x: max_running must not be negative
}
