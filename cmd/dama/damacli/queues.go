package damacli

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// newControlCommands makes pause, resume, block and unblock. Each acts
// through a client with the configuration when one is given, which then
// names the queues and kinds, else checking names against the database.
func newControlCommands(g *globals) []*cobra.Command {
	var reason string
	controls := []struct {
		cmd *cobra.Command
		// reasonUsage, when set, gives the command --reason.
		reasonUsage string
		do          func(ctx context.Context, c *dama.Client, name string) (string, error)
	}{{
		cmd: &cobra.Command{
			Use:               "pause QUEUE",
			ValidArgsFunction: g.complete((*config.Config).QueueNames),
			Short:             "Start no task of a queue until it is resumed; running tasks go on",
			Long: `Pause a queue: once the command returns, no task of the queue starts, on any
supervisor, until dama resume. Running tasks go on and are still watched and
completed; submitted tasks wait, and dama queues counts them.`,
		},
		reasonUsage: "why, shown by dama queues",
		do: func(ctx context.Context, c *dama.Client, queue string) (string, error) {
			p, err := c.PauseQueue(ctx, queue, reason)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("queue %s paused since %s by %s%s", p.Queue, zoned(p.PausedAt), p.PausedBy, reasonSuffix(p.Reason)), nil
		},
	}, {
		cmd: &cobra.Command{
			Use:               "resume QUEUE",
			ValidArgsFunction: g.complete((*config.Config).QueueNames),
			Short:             "Resume a paused queue",
		},
		do: func(ctx context.Context, c *dama.Client, queue string) (string, error) {
			if resumed, err := c.ResumeQueue(ctx, queue); err != nil || !resumed {
				return "queue " + queue + " was not paused", err
			}
			return "queue " + queue + " resumed", nil
		},
	}, {
		cmd: &cobra.Command{
			Use:               "block KIND --reason TEXT",
			ValidArgsFunction: g.complete((*config.Config).KindNames),
			Short:             "Start no task of a kind until it is unblocked; submissions are kept",
			Long: `Block a kind: once the command returns, no task of the kind starts, on any
supervisor and in any queue, until dama unblock. Submissions are accepted and
kept; running tasks go on. dama queues and the view show the block and its
reason.`,
		},
		reasonUsage: "why (required), shown by dama queues",
		do: func(ctx context.Context, c *dama.Client, kind string) (string, error) {
			b, err := c.BlockKind(ctx, kind, reason)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("kind %s blocked since %s by %s%s", b.Kind, zoned(b.BlockedAt), b.BlockedBy, reasonSuffix(b.Reason)), nil
		},
	}, {
		cmd: &cobra.Command{
			Use:               "unblock KIND",
			ValidArgsFunction: g.complete((*config.Config).KindNames),
			Short:             "Unblock a blocked kind",
		},
		do: func(ctx context.Context, c *dama.Client, kind string) (string, error) {
			if unblocked, err := c.UnblockKind(ctx, kind); err != nil || !unblocked {
				return "kind " + kind + " was not blocked", err
			}
			return "kind " + kind + " unblocked", nil
		},
	}}
	cmds := make([]*cobra.Command, len(controls))
	for i, c := range controls {
		c.cmd.Args = cobra.ExactArgs(1)
		c.cmd.RunE = func(cmd *cobra.Command, argv []string) error {
			var cfg *config.Config
			if g.configPath != "" {
				var err error
				if cfg, err = config.Load(g.configPath); err != nil {
					return err
				}
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := dama.NewClient(pool, cfg)
			if err != nil {
				return err
			}
			line, err := c.do(cmd.Context(), client, argv[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), line)
			return nil
		}
		if c.reasonUsage != "" {
			c.cmd.Flags().StringVar(&reason, "reason", "", c.reasonUsage)
		}
		cmds[i] = c.cmd
	}
	return cmds
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

func newQueuesCommand() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "queues",
		Short: "Show per queue and kind what waits, runs and finished (data_manager.dama_queue_stats)",
		Args:  cobra.NoArgs,
	}, etlcontext.QueueStats,
		"QUEUE\tKIND\tQUEUED\tSCHEDULED\tRUNNING\tRETRYING\tDONE 24H\tFAILED 24H\tCANCELLED 24H\tOLDEST WAITING\tPAUSED\tBLOCKED",
		func(s etlcontext.QueueStat) string {
			oldest := "-"
			if s.OldestWaiting != nil {
				oldest = s.OldestWaiting.Round(time.Second).String()
			}
			paused, blocked := "-", "-"
			if s.Paused {
				paused = "yes" + quoted(s.PauseReason)
			}
			if s.Blocked {
				blocked = "yes" + quoted(s.BlockReason)
			}
			return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s",
				shownText(orDash(s.Queue)), shownText(orDash(s.Kind)), s.Queued, s.Scheduled, s.Running, s.Retrying,
				s.Done24h, s.Failed24h, s.Cancelled24h, oldest, paused, blocked)
		})
}

func quoted(s *string) string {
	if s == nil || *s == "" {
		return ""
	}
	return ": " + strconv.Quote(*s)
}

func newSchedulesCommand() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "schedules",
		Short: "Show the periodic kinds' last and next ticks (data_manager.dama_schedules)",
		Long: `Show, per periodic kind, its schedule, the last tick taken and what it did
(submitted a task, skipped because one was unfinished, or the baseline of a
new or changed schedule), the status of the task it submitted, and the next
tick. A kind appears once a supervisor configuring it has run.`,
		Args: cobra.NoArgs,
	}, etlcontext.Schedules,
		"KIND\tSCHEDULE\tTIMEZONE\tOVERLAP\tLAST TICK\tOUTCOME\tTASK\tSTATUS\tNEXT TICK",
		func(s etlcontext.Schedule) string {
			task, status, next := "-", "-", "-"
			if s.LastContextID != nil {
				task = strconv.FormatInt(*s.LastContextID, 10)
			}
			if s.LastStatus != nil {
				status = string(*s.LastStatus)
			}
			if s.NextTick != nil {
				next = zoned(*s.NextTick)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", s.Kind, s.Spec, s.Timezone, s.Overlap,
				zoned(s.LastTick), s.LastOutcome, task, status, next)
		})
}

// listCommand completes cmd, which prints what read returns: a row per
// element under header, or JSON with --json.
func listCommand[T any](cmd *cobra.Command, read func(context.Context, etlcontext.DB) ([]T, error),
	header string, row func(T) string) *cobra.Command {
	var asJSON bool
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		pool, _, err := connectMigrated(cmd.Context(), 0)
		if err != nil {
			return err
		}
		defer pool.Close()
		list, err := read(cmd.Context(), pool)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for _, x := range list {
			fmt.Fprintln(tw, row(x))
		}
		return tw.Flush()
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSupervisorsCommand() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "supervisors",
		Short: "Show the supervisors, serving or gone in the last day (data_manager.dama_supervisors)",
		Long: `Show the supervisors that serve this database, then those that stopped or
were lost in the last day: host, pid, release, lock modes, the queues and
kinds served, the tasks running on the host in its queues, when it started
and when it was last seen. A supervisor serves while it holds its liveness
lock: SERVING, then STOPPED once it stopped cleanly, or LOST (killed, or cut
off from the database).`,
		Args: cobra.NoArgs,
	}, etlcontext.Supervisors,
		"STATE\tHOST\tPID\tRELEASE\tLOCK\tQUEUES\tKINDS\tRUNNING\tSTARTED\tLAST SEEN",
		func(s etlcontext.Supervisor) string {
			now := time.Now()
			list := func(l []string) string { return shownText(cmp.Or(strings.Join(l, ","), "-")) }
			release := "earlier" // than the one that records what it serves
			if s.Release != nil {
				release = shownText(*s.Release)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s ago", s.State, shownText(s.Host), intOrDash(s.PID), release,
				list(s.LockModes), list(s.Queues), list(s.Kinds), intOrDash(s.Running), localTime(s.StartedAt, now),
				etlcontext.Human(now.Sub(s.LastSeenAt)))
		})
}
