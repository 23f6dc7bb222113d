package damacli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// controlClient connects and returns a client for pause, resume, block and
// unblock: with the configuration when one is given, which then names the
// queues and kinds, else checking names against the database.
func controlClient(cmd *cobra.Command, g *globals) (*dama.Client, func(), error) {
	var cfg *config.Config
	if g.configPath != "" {
		var err error
		if cfg, err = config.Load(g.configPath); err != nil {
			return nil, nil, err
		}
	}
	pool, _, err := connectMigrated(cmd.Context(), 0)
	if err != nil {
		return nil, nil, err
	}
	client, err := dama.NewClient(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return client, pool.Close, nil
}

func newPauseCommand(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:               "pause QUEUE",
		ValidArgsFunction: g.completeQueues,
		Short:             "Start no task of a queue until it is resumed; running tasks go on",
		Long: `Pause a queue: once the command returns, no task of the queue starts, on any
supervisor, until dama resume. Running tasks go on and are still watched and
completed; submitted tasks wait, and dama queues counts them.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			client, done, err := controlClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			p, err := client.PauseQueue(cmd.Context(), argv[0], reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "queue %s paused since %s by %s%s\n", p.Queue, p.PausedAt.Local().Format(time.DateTime), p.PausedBy, reasonSuffix(p.Reason))
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown by dama queues")
	return cmd
}

func newResumeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "resume QUEUE",
		ValidArgsFunction: g.completeQueues,
		Short:             "Resume a paused queue",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			client, done, err := controlClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			resumed, err := client.ResumeQueue(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if resumed {
				fmt.Fprintf(cmd.OutOrStdout(), "queue %s resumed\n", argv[0])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "queue %s was not paused\n", argv[0])
			}
			return nil
		},
	}
}

func newBlockCommand(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:               "block KIND --reason TEXT",
		ValidArgsFunction: g.completeKinds,
		Short:             "Start no task of a kind until it is unblocked; submissions are kept",
		Long: `Block a kind: once the command returns, no task of the kind starts, on any
supervisor and in any queue, until dama unblock. Submissions are accepted and
kept; running tasks go on. dama queues and the view show the block and its
reason.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			client, done, err := controlClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			b, err := client.BlockKind(cmd.Context(), argv[0], reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "kind %s blocked since %s by %s%s\n", b.Kind, b.BlockedAt.Local().Format(time.DateTime), b.BlockedBy, reasonSuffix(b.Reason))
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required), shown by dama queues")
	return cmd
}

func newUnblockCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "unblock KIND",
		ValidArgsFunction: g.completeKinds,
		Short:             "Unblock a blocked kind",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			client, done, err := controlClient(cmd, g)
			if err != nil {
				return err
			}
			defer done()
			unblocked, err := client.UnblockKind(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if unblocked {
				fmt.Fprintf(cmd.OutOrStdout(), "kind %s unblocked\n", argv[0])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "kind %s was not blocked\n", argv[0])
			}
			return nil
		},
	}
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

func newQueuesCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "Show per queue and kind what waits, runs and finished (data_manager.dama_queue_stats)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			stats, err := etlcontext.QueueStats(cmd.Context(), pool)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(jsonShown{out})
				enc.SetIndent("", "  ")
				return enc.Encode(stats)
			}
			return printQueueStats(out, stats)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printQueueStats(w io.Writer, stats []etlcontext.QueueStat) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tKIND\tQUEUED\tSCHEDULED\tRUNNING\tRETRYING\tDONE 24H\tFAILED 24H\tCANCELLED 24H\tOLDEST WAITING\tPAUSED\tBLOCKED")
	for _, s := range stats {
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n",
			shownText(orDash(s.Queue)), shownText(orDash(s.Kind)), s.Queued, s.Scheduled, s.Running, s.Retrying,
			s.Done24h, s.Failed24h, s.Cancelled24h, oldest, paused, blocked)
	}
	return tw.Flush()
}

func quoted(s *string) string {
	if s == nil || *s == "" {
		return ""
	}
	return ": " + strconv.Quote(*s)
}

func newSchedulesCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "Show the periodic kinds' last and next ticks (data_manager.dama_schedules)",
		Long: `Show, per periodic kind, its schedule, the last tick taken and what it did
(submitted a task, skipped because one was unfinished, or the baseline of a
new or changed schedule), the status of the task it submitted, and the next
tick. A kind appears once a supervisor configuring it has run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			list, err := etlcontext.Schedules(cmd.Context(), pool)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(jsonShown{out})
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tSCHEDULE\tTIMEZONE\tOVERLAP\tLAST TICK\tOUTCOME\tTASK\tSTATUS\tNEXT TICK")
			for _, s := range list {
				task, status, next := "-", "-", "-"
				if s.LastContextID != nil {
					task = strconv.FormatInt(*s.LastContextID, 10)
				}
				if s.LastStatus != nil {
					status = string(*s.LastStatus)
				}
				if s.NextTick != nil {
					next = s.NextTick.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Kind, s.Spec, s.Timezone, s.Overlap,
					s.LastTick.Local().Format(time.DateTime), s.LastOutcome, task, status, next)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
