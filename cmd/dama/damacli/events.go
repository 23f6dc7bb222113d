package damacli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
)

func newEventsCommand() *cobra.Command {
	var id int64
	return listCommand(&cobra.Command{
		Use:   "events ID",
		Short: "Show the events of a task",
		Args:  cobra.ExactArgs(1),
		PreRunE: func(_ *cobra.Command, argv []string) (err error) {
			id, err = parseID(argv[0])
			return err
		},
	}, func(ctx context.Context, db etlcontext.DB) ([]etlcontext.Event, error) {
		if _, err := etlcontext.Get(ctx, db, id); err != nil {
			return nil, err
		}
		return etlcontext.Events(ctx, db, id)
	}, "EVENT\tTIME\tATTEMPT\tTYPE\tPAYLOAD", func(e etlcontext.Event) string {
		payload := string(e.Payload)
		if payload == "" {
			payload = string(e.Meta)
		}
		return fmt.Sprintf("%d\t%s\t%d\t%s\t%s", e.ID, zoned(e.CreatedAt), e.Attempt, shownText(e.Type), shownText(payload))
	})
}
