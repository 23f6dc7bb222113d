package damacli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newReadyCommand asks a supervisor, at its --metrics-listen address,
// whether it works. Run in the supervisor's container, as a readiness
// probe, it reaches a listener that stays on localhost, which a probe of
// the kubelet's, sent to the pod's address, would not.
func newReadyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ready ADDR",
		Short: "Exit 0 when the supervisor serving metrics on ADDR works (a readiness probe)",
		Long: `Exit 0 when the supervisor started with --metrics-listen ADDR works: it holds
its liveness lock, listens, and fetches its queues' jobs. Otherwise exit 1,
saying why in one line. For a container's readiness probe, run in the
supervisor's container, where ADDR stays on localhost (a bare :PORT is
localhost too).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := listenAddr(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/ready", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if ue := (*url.Error)(nil); errors.As(err, &ue) {
					err = ue.Err
				}
				return fmt.Errorf("no supervisor answers on %s: %w", addr, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if err != nil {
				return fmt.Errorf("read the answer of %s: %w", addr, err)
			}
			switch resp.StatusCode {
			case http.StatusOK:
				_, err = cmd.OutOrStdout().Write(body)
				return err
			case http.StatusServiceUnavailable:
				return fmt.Errorf("the supervisor on %s is %s", addr, strings.TrimSpace(string(body)))
			}
			return fmt.Errorf("%s answered /ready with %s: is it a supervisor's --metrics-listen?", addr, resp.Status)
		},
	}
}
