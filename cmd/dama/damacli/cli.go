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

// starterName is the configuration file a command reads from its working
// directory when neither --config nor DAMA_CONFIG names one: what `dama
// init` writes.
const starterName = "dama.yaml"

// settleConfig checks the configuration file named by --config (flagSet)
// or DAMA_CONFIG, or else takes ./dama.yaml if there is one. A file the
// user named must exist, whether or not the command reads it. ./dama.yaml
// is read only when it is a file (not a link) of this user's (or root's),
// in a directory of theirs, that no other user may write or replace: in a
// directory others write to, such as /tmp or another user's home, they
// could have put it there or swap it later, and its kinds' commands would
// run.
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
	if err != nil {
		return fmt.Errorf("read %s: %w", abs, err)
	}
	dir, err := os.Stat(filepath.Dir(abs))
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Dir(abs), err)
	}
	// Task processes read the file again at each launch: whoever may
	// replace it, in its directory, chooses what they run.
	for _, f := range []struct {
		name string
		fi   fs.FileInfo
	}{{abs, fi}, {filepath.Dir(abs), dir}} {
		st, ok := f.fi.Sys().(*syscall.Stat_t)
		switch {
		case f.fi == fi && !fi.Mode().IsRegular():
			return fmt.Errorf("%s is not a file: not read (pass --config to name the configuration)", abs)
		case !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0):
			return fmt.Errorf("%s belongs to another user: %s not read (pass --config to read it anyway)", f.name, starterName)
		case f.fi.Mode().Perm()&0o022 != 0:
			return fmt.Errorf("%s may be written by other users (mode %04o): %s not read (chmod go-w it, or pass --config)", f.name, f.fi.Mode().Perm(), starterName)
		}
	}
	g.configPath = abs
	return nil
}
