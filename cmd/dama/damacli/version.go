package damacli

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the release, commit, runner protocol and schema version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), versionText())
			return err
		},
	}
}

// versionText is what `dama version` and `dama --version` print: a line
// per fact, "name value", for people and scripts alike.
func versionText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dama %s\n", version.Release)
	fmt.Fprintf(&b, "commit %s\n", version.Commit())
	fmt.Fprintf(&b, "protocol %d\n", protocol.Version)
	if latest, err := sql.Latest(); err == nil {
		fmt.Fprintf(&b, "schema %d\n", latest)
	}
	fmt.Fprintf(&b, "go %s\n", runtime.Version())
	return b.String()
}
