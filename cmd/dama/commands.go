package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/schema"
	"github.com/dama-etl/dama/supervisor"
)

// connect opens a pool on DATABASE_URL and checks that the database answers
// and is migrated, so that either is one clear error before anything else.
func connect(ctx context.Context) (*pgxpool.Pool, string, error) {
	return connectSized(ctx, 0)
}

// connectSized is connect with a pool of at least minConns connections,
// unless DATABASE_URL sets pool_max_conns itself.
func connectSized(ctx context.Context, minConns int32) (*pgxpool.Pool, string, error) {
	url, err := databaseURL()
	if err != nil {
		return nil, "", err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, minConns)
	}
	// River's listener waits idle on one of these connections for hours.
	pcfg.AfterConnect = pgsession.KeepIdle
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", fmt.Errorf("connect to database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("connect to database: %w", err)
	}
	return pool, url, nil
}

// connectMigrated is connect for the commands that need dama's schema.
func connectMigrated(ctx context.Context, minConns int32) (*pgxpool.Pool, string, error) {
	pool, url, err := connectSized(ctx, minConns)
	if err != nil {
		return nil, "", err
	}
	if err := schema.CheckMigrated(ctx, pool); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, url, nil
}

// waitForDatabase is connectMigrated that waits, until ctx ends, for a
// database that restarts or fails over (a supervisor that systemd restarts
// meanwhile, say), reporting the wait: whatever pgerr.Unreachable says a
// later connection may cure, a full server among them. An unmigrated
// database, a malformed URL or a login the server refuses (a password, a
// missing database) is an error at once; a host name that does not
// resolve is waited for, as a failover's DNS change may need.
func waitForDatabase(ctx context.Context, logger *slog.Logger, minConns int32) (*pgxpool.Pool, string, error) {
	start := time.Now()
	for tries := 1; ; tries++ {
		pool, url, err := connectMigrated(ctx, minConns)
		if err == nil {
			if tries > 1 {
				logger.Info("database reachable", "waited", time.Since(start).Round(time.Millisecond))
			}
			return pool, url, nil
		}
		if !pgerr.Unreachable(err) {
			return nil, "", err
		}
		if tries == 1 || tries%30 == 0 {
			logger.Warn("database unreachable; waiting for it", "error", err, "for", time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("database unreachable: %w", err)
		case <-time.After(time.Second):
		}
	}
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// addLogFormat gives cmd, a command that logs, the --log-format flag.
func (g *globals) addLogFormat(cmd *cobra.Command) {
	cmd.Flags().StringVar(&g.logFormat, "log-format", "text", "format of the logs: text (logfmt) or json (one object per line)")
}

// logger returns the logger of --log-format: logfmt text (the default) or
// one JSON object per line.
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	switch g.logFormat {
	case "text":
		return newLogger(w), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", g.logFormat)
}

// completeKinds completes a kind of the configuration.
func (g *globals) completeKinds(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, err := config.Load(g.configPath)
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return cfg.KindNames(), cobra.ShellCompDirectiveNoFileComp
}

// completeQueues completes a queue of the configuration.
func (g *globals) completeQueues(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, err := config.Load(g.configPath)
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return cfg.QueueNames(), cobra.ShellCompDirectiveNoFileComp
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid etl context id %q: want a positive integer", s)
	}
	return id, nil
}

// openContext parses a context id argument and connects; the caller closes
// the pool.
func openContext(ctx context.Context, arg string) (int64, *pgxpool.Pool, error) {
	id, err := parseID(arg)
	if err != nil {
		return 0, nil, err
	}
	pool, _, err := connectMigrated(ctx, 0)
	if err != nil {
		return 0, nil, err
	}
	return id, pool, nil
}

func newMigrateCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply River's and dama's migrations (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			pool, _, err := connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := schema.Migrate(cmd.Context(), pool, logger); err != nil {
				return err
			}
			if err := schema.CheckRoles(cmd.Context(), pool); errors.Is(err, schema.ErrRolesIncomplete) {
				// What this role may not do, an administrator may.
				fmt.Fprintf(cmd.OutOrStdout(), "-- %s\n-- Run this as an administrator, in this database:\n%s", oneLine(err.Error()), schema.RolesSQL())
			} else if err != nil {
				return err
			}
			return nil
		},
	}
	g.addLogFormat(cmd)
	return cmd
}

func newRolesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "roles",
		Short: "Print the SQL that creates dama's roles and grants their rights (for an administrator)",
		Long: `Print the SQL that creates dama's database roles (NOLOGIN; grant them to
login roles) and grants each its rights in the database it is run in. dama
migrate does the same when its role may; run this as an administrator
otherwise, after each dama migrate. Needs no database.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(cmd.OutOrStdout(), schema.RolesSQL())
			return nil
		},
	}
}

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
			// Steps hold a connection for a few milliseconds each, River's
			// producers and completer need their own: pgxpool's default
			// (4 on two cores) would make steps queue for connections.
			logger, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			var reg *prometheus.Registry
			stopMetrics := func() {}
			if metricsListen != "" {
				reg = newMetricsRegistry()
				metrics, err := listenMetrics(metricsListen, reg, logger)
				if err != nil {
					return err
				}
				// Served from now on, the process's metrics while the
				// database is waited for too, and until the supervisor
				// has stopped: a signal ends Run, then this.
				ctx, stop := context.WithCancel(context.WithoutCancel(cmd.Context()))
				served := make(chan struct{})
				go func() {
					defer close(served)
					metrics.serve(ctx, logger)
				}()
				stopMetrics = sync.OnceFunc(func() {
					stop()
					<-served
				})
				defer stopMetrics()
			}
			pool, url, err := waitForDatabase(cmd.Context(), logger, 20)
			if err != nil {
				return err
			}
			defer func() {
				// No scrape reads the database's statistics from a
				// closed pool.
				stopMetrics()
				pool.Close()
			}()
			// Task processes connect as the supervisor does, or, least
			// privilege, as a member of dama_task.
			taskURL := url
			if u := os.Getenv(taskDatabaseURLEnv); u != "" {
				if _, err := pgx.ParseConfig(u); err != nil {
					return fmt.Errorf("$%s: %w", taskDatabaseURLEnv, err)
				}
				taskURL = u
			}
			opts := supervisor.Options{DatabaseURL: taskURL, Logger: logger}
			if reg != nil {
				opts.Registerer = reg
			}
			s, err := supervisor.New(pool, cfg, opts)
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
	g.addLogFormat(cmd)
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus metrics on http://ADDR/metrics (ADDR e.g. 127.0.0.1:9464; a bare :PORT is on localhost); empty: none")
	return cmd
}

func newSubmitCommand(g *globals, code *exitCode) *cobra.Command {
	var (
		wait   bool
		args   string
		key    string
		parent int64
		delay  time.Duration
		runAt  string
	)
	cmd := &cobra.Command{
		Use:               "submit KIND",
		ValidArgsFunction: g.completeKinds,
		Short:             "Submit a task; prints its etl_context_id",
		Long: `Submit a task of a configured kind and print its etl_context_id alone on
stdout. With --idempotency-key, submitting the same key again with the same
kind prints the id of the first submission and creates nothing; with
another kind it is an error. Keys starting with "dama:" are dama's own and
refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			if _, ok := cfg.Kind(argv[0]); !ok {
				return fmt.Errorf("unknown kind %q: the configuration has %s", argv[0], strings.Join(cfg.KindNames(), ", "))
			}
			if !json.Valid([]byte(args)) {
				return errors.New("--args is not valid JSON")
			}
			due, err := dueAt(runAt, delay, time.Now())
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := supervisor.NewClient(pool, cfg)
			if err != nil {
				return err
			}
			p := supervisor.SubmitParams{Kind: argv[0], Args: json.RawMessage(args), IdempotencyKey: key, ParentID: parent, ScheduledAt: due}
			id, _, err := client.Submit(cmd.Context(), p)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			if !wait {
				return nil
			}
			c, err := waitForTask(cmd.Context(), client, pool, id, cmd.ErrOrStderr())
			*code = exitCode(c)
			return err
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the task to finish, showing its progress on stderr; exit 0 only when it is DONE (20 FAILED, 21 CANCELLED, 22 wait ended first)")
	cmd.Flags().StringVar(&args, "args", "{}", "the task's arguments, a JSON document")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "submit at most once for this key")
	cmd.Flags().Int64Var(&parent, "parent", 0, "etl_context_id of the parent task")
	cmd.Flags().DurationVar(&delay, "delay", 0, "start no earlier than this long from now")
	cmd.Flags().StringVar(&runAt, "run-at", "", "start no earlier than this time (RFC 3339, e.g. 2026-11-22T18:00:00+01:00)")
	return cmd
}

// dueAt is when a task submitted at now with --run-at and --delay may
// start; zero means at once.
func dueAt(runAt string, delay time.Duration, now time.Time) (time.Time, error) {
	switch {
	case delay < 0:
		return time.Time{}, errors.New("--delay must not be negative")
	case runAt != "" && delay > 0:
		return time.Time{}, errors.New("--run-at and --delay exclude each other")
	case runAt != "":
		t, err := time.Parse(time.RFC3339, runAt)
		if err != nil {
			return time.Time{}, fmt.Errorf("--run-at %q: want an RFC 3339 time such as 2026-11-22T18:00:00Z", runAt)
		}
		return t, nil
	case delay > 0:
		return now.Add(delay), nil
	}
	return time.Time{}, nil
}

func newStatusCommand() *cobra.Command {
	var (
		asJSON   bool
		limit    int
		statuses []string
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show tasks from data_manager.dama_task_queue",
		Long: `Show tasks from data_manager.dama_task_queue, newest first: one task by ID,
or the newest --limit tasks, optionally only those in the given --status.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			q := etlcontext.TaskQuery{Limit: limit}
			if len(argv) == 1 {
				var err error
				if q.ID, err = parseID(argv[0]); err != nil {
					return err
				}
			}
			if limit < 0 {
				return errors.New("--limit must not be negative")
			}
			for _, st := range statuses {
				st := etlcontext.Status(strings.ToUpper(st))
				if !slices.Contains(etlcontext.Statuses, st) {
					return fmt.Errorf("unknown status %q: want one of %v", st, etlcontext.Statuses)
				}
				q.Statuses = append(q.Statuses, st)
			}
			id := q.ID
			if watch && asJSON {
				return errors.New("--watch and --json exclude each other")
			}
			if watch && interval < 100*time.Millisecond {
				return errors.New("--interval must be at least 100ms")
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			tasks, err := etlcontext.Tasks(cmd.Context(), pool, q)
			if err != nil {
				return err
			}
			if id != 0 && len(tasks) == 0 {
				return fmt.Errorf("etl context %d not found", id)
			}
			if watch {
				return watchTasks(cmd.Context(), pool, q, cmd.OutOrStdout(), interval)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if id != 0 {
					return enc.Encode(tasks[0])
				}
				return enc.Encode(tasks)
			}
			return printTasks(out, tasks)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&limit, "limit", 50, "show at most this many tasks, newest first (0: all)")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "show only tasks in these statuses (QUEUED,RUNNING,...)")
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw the table, with progress bars, every --interval until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often --watch redraws")
	return cmd
}

func printTasks(w io.Writer, tasks []etlcontext.Task) error {
	return printTaskTable(w, tasks, func(p []byte) string { return string(p) })
}

// printTaskTable prints tasks as a table, their progress drawn by progress.
func printTaskTable(w io.Writer, tasks []etlcontext.Task, progress func([]byte) string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tQUEUE\tSTATUS\tATTEMPT\tJOB\tWAITING\tCHILDREN\tHOST\tPID\tLOCKED\tLATEST EVENT\tPROGRESS")
	for _, t := range tasks {
		latest := "-"
		if t.LatestEventType != nil {
			latest = *t.LatestEventType
			if t.LatestEventAt != nil {
				latest += " " + t.LatestEventAt.Local().Format("15:04:05")
			}
		}
		shown := "-"
		if len(t.Progress) > 0 {
			shown = progress(t.Progress)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\n",
			t.ID, t.Kind, t.Queue, t.Status, t.Attempt, t.MaxAttempts,
			orDash(t.JobState), waiting(t), children(t.Children), orDash(t.Host), intOrDash(t.PID), t.InitialEventLocked, latest, shown)
	}
	return tw.Flush()
}

// children summarizes a task's children: how many are DONE of how many,
// and how many did not end DONE.
func children(c etlcontext.Children) string {
	if len(c) == 0 {
		return "-"
	}
	total := 0
	for _, n := range c {
		total += n
	}
	s := fmt.Sprintf("%d/%d done", c[etlcontext.StatusDone], total)
	if f := c.Failed(); f > 0 {
		s += fmt.Sprintf(", %d failed", f)
	}
	return s
}

// waiting says why a task that has not started waits: until when it is
// due, or for what.
func waiting(t etlcontext.Task) string {
	switch {
	case t.Status != etlcontext.StatusQueued && t.Status != etlcontext.StatusRetrying:
		return "-"
	case t.WaitingFor != nil:
		return *t.WaitingFor
	case t.Status == etlcontext.StatusQueued && t.DueAt != nil && t.DueAt.After(time.Now()):
		return "until " + t.DueAt.Local().Format(time.DateTime)
	}
	return "-"
}

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func intOrDash(i *int) string {
	if i == nil {
		return "-"
	}
	return strconv.Itoa(*i)
}

func newEventsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "events ID",
		Short: "Show the events of a task",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, pool, err := openContext(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			defer pool.Close()
			if _, err := etlcontext.Get(cmd.Context(), pool, id); err != nil {
				return err
			}
			events, err := etlcontext.Events(cmd.Context(), pool, id)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(events)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT\tTIME\tATTEMPT\tTYPE\tPAYLOAD")
			for _, e := range events {
				payload := string(e.Payload)
				if payload == "" {
					payload = string(e.Meta)
				}
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", e.ID, e.CreatedAt.Local().Format(time.DateTime), e.Attempt, e.Type, oneLine(payload))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newLogsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print the log file of a task (on the host it ran on)",
		Long: `Print the log file of a task: the task process's own lines and its command's
output. The file is on the host the task ran on. With --follow, keep printing
what is appended until the task is finished.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			id, pool, err := openContext(ctx, argv[0])
			if err != nil {
				return err
			}
			defer pool.Close()
			c, err := etlcontext.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			for follow && c.LogPath == nil && !c.Status.Finished() {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				if c, err = etlcontext.Get(ctx, pool, id); err != nil {
					return err
				}
			}
			if c.LogPath == nil {
				return fmt.Errorf("etl context %d has no log (it is %s and never started)", id, c.Status)
			}
			f, err := os.Open(*c.LogPath)
			if err != nil {
				return fmt.Errorf("open log of etl context %d (the task ran on %s): %w", id, orDash(c.Host), err)
			}
			defer f.Close()
			out := cmd.OutOrStdout()
			if _, err := io.Copy(out, f); err != nil || !follow {
				return err
			}
			return followLog(ctx, pool, id, f, out)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the task is finished")
	return cmd
}

// followLog copies what is appended to f until the context is finished (and
// its log drained) or ctx ends. Later attempts append to the same file.
func followLog(ctx context.Context, pool *pgxpool.Pool, id int64, f *os.File, out io.Writer) error {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		finished := false
		c, err := etlcontext.Get(ctx, pool, id)
		if err == nil {
			finished = c.Status.Finished()
		}
		n, err := io.Copy(out, f)
		if err != nil {
			return err
		}
		if finished && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func newCancelCommand(g *globals, code *exitCode) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task, stopping its process wherever it runs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseID(argv[0])
			if err != nil {
				return err
			}
			// Within --wait, a database that restarts or fails over is
			// waited for, from the first connection on.
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			pool, _, err := waitForDatabase(ctx, slog.New(slog.DiscardHandler), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := supervisor.NewClient(pool, nil)
			if err != nil {
				return err
			}
			status, err := client.Cancel(ctx, id)
			if errors.Is(err, supervisor.ErrCancelPending) {
				*code = exitCancelPending
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), status)
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "how long to wait for the task to stop")
	return cmd
}

func newRetryCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Run a FAILED or CANCELLED task again, from its latest checkpoint",
		Long: `Run a FAILED or CANCELLED task again as a new attempt, which gets the task's
latest checkpoint like any retry, with its kind's max_attempts more attempts.
The task keeps its id, its events and its attempt count; a RETRIED event
records who retried it. Prints QUEUED.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseID(argv[0])
			if err != nil {
				return err
			}
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := supervisor.NewClient(pool, cfg)
			if err != nil {
				return err
			}
			if err := client.Retry(cmd.Context(), id); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), etlcontext.StatusQueued)
			return nil
		},
	}
}
