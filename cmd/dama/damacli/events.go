package damacli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
)

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
				enc := json.NewEncoder(jsonShown{out})
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
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", e.ID, e.CreatedAt.Local().Format(time.DateTime), e.Attempt, shownText(e.Type), shownText(payload))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
