package damacli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
)

// addLogFormat gives cmd, a command that logs, the --log-format flag.
func (g *globals) addLogFormat(cmd *cobra.Command) {
	cmd.Flags().StringVar(&g.logFormat, "log-format", "text", "format of the logs: text (logfmt) or json (one object per line)")
}

// logger returns the logger of --log-format.
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, nil)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", g.logFormat)
}

// complete completes an argument with the names the configuration has.
func (g *globals) complete(names func(*config.Config) []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		cfg, err := config.Load(g.configPath)
		if err != nil || len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names(cfg), cobra.ShellCompDirectiveNoFileComp
	}
}

// starterName is the configuration file, as `dama init` writes it, that a
// command reads in its working directory when none is named.
const starterName = "dama.yaml"

// settleConfig checks that the file named by --config (flagSet) or
// DAMA_CONFIG exists, whether or not the command reads it, or else takes
// ./dama.yaml if it is a file (not a link) of this user's (or root's), in a
// directory of theirs, that no other user may write or replace: others
// could have put it in /tmp, say, or swap it later, and its commands would run.
func (g *globals) settleConfig(flagSet bool) error {
	if g.configPath != "" {
		from := "DAMA_CONFIG="
		if flagSet {
			from = "--config "
		}
		fi, err := os.Stat(g.configPath)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%s%s: no such file", from, g.configPath)
		case err != nil:
			return fmt.Errorf("%s%s: %w", from, g.configPath, err)
		case fi.IsDir():
			return fmt.Errorf("%s%s: a directory, not a configuration file", from, g.configPath)
		}
		return nil
	}
	fi, err := os.Lstat(starterName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	abs, aerr := filepath.Abs(starterName)
	if aerr != nil {
		abs = starterName
	}
	switch {
	case err != nil:
		return fmt.Errorf("read %s: %w", abs, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a file: not read (pass --config to name the configuration)", abs)
	}
	// Task processes read the file again at each launch: whoever may
	// replace it, in its directory, chooses what they run.
	for _, name := range []string{abs, filepath.Dir(abs)} {
		fi, err := os.Stat(name)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0):
			return fmt.Errorf("%s belongs to another user: %s not read (pass --config to read it anyway)", name, starterName)
		case fi.Mode().Perm()&0o022 != 0:
			return fmt.Errorf("%s may be written by other users (mode %04o): %s not read (chmod go-w it, or pass --config)", name, fi.Mode().Perm(), starterName)
		}
	}
	g.configPath = abs
	return nil
}
