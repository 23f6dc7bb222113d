package damacli

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/supervisor"
)

// taskDatabaseURLEnv names the URL a supervisor's task processes connect
// with, when not its own (DATABASE_URL).
const taskDatabaseURLEnv = "DAMA_TASK_DATABASE_URL"

func newSupervisorCommand(g *globals) *cobra.Command {
	var metricsListen string
	cmd := &cobra.Command{
		Use:   "supervisor",
		Short: "Run tasks of the configured kinds until SIGTERM or SIGINT",
		Long: `Run tasks of the configured kinds until SIGTERM or SIGINT. Stopping the
supervisor never stops a task: the next supervisor adopts the tasks still
running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			program, err := taskProgram()
			if err != nil {
				return err
			}
			logger, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			opts := supervisor.Options{Logger: logger, Executable: program}
			if program != "" {
				opts.CheckExecutable = checkTaskProgram
			}
			stopMetrics := func() {}
			// Closed once the supervisor works: --metrics-listen's /ready.
			ready := make(chan struct{})
			if metricsListen != "" {
				reg := newMetricsRegistry()
				opts.Registerer = reg
				// Served while the database is waited for too, and
				// until the supervisor has stopped.
				if stopMetrics, err = serveMetrics(metricsListen, reg, ready, logger); err != nil {
					return err
				}
				defer stopMetrics()
			}
			// Steps hold a connection for a few milliseconds each, River's
			// producers and completer need their own: pgxpool's default
			// (4 on two cores) would make steps queue for connections.
			pool, url, err := waitForDatabase(cmd.Context(), logger, 20, closeIdle)
			if err != nil {
				return err
			}
			defer func() {
				// No scrape reads the statistics of a closed pool.
				stopMetrics()
				pool.Close()
			}()
			// Task processes connect as the supervisor does, or, least
			// privilege, as a member of dama_task.
			opts.DatabaseURL = url
			if u := os.Getenv(taskDatabaseURLEnv); u != "" {
				if _, err := pgx.ParseConfig(u); err != nil {
					return fmt.Errorf("$%s: %w", taskDatabaseURLEnv, err)
				}
				opts.DatabaseURL = u
			}
			if g.opts.Pods != nil {
				if opts.Pods, err = g.opts.Pods(cfg, logger); err != nil {
					return err
				}
			}
			s, err := supervisor.New(pool, cfg, opts)
			if err != nil {
				return err
			}
			// A service manager (systemd's Type=notify, a test) hears
			// when the supervisor works, and when it stops.
			go func() {
				select {
				case <-s.Started():
					close(ready)
					notify(logger, daemon.SdNotifyReady)
				case <-cmd.Context().Done():
				}
			}()
			err = s.Run(cmd.Context())
			notify(logger, daemon.SdNotifyStopping)
			return err
		},
	}
	g.addLogFormat(cmd)
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus metrics on http://ADDR/metrics, and whether the supervisor works on http://ADDR/ready (dama ready ADDR); ADDR e.g. 127.0.0.1:9464, a bare :PORT is on localhost; empty: none")
	return cmd
}

// notify tells the service manager named by NOTIFY_SOCKET, if any, the
// supervisor's state (sd_notify(3)); task processes do not get the
// variable (supervisor.runnerEnv).
func notify(logger *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		logger.Warn("notify the service manager", "state", state, "error", err)
	}
}
