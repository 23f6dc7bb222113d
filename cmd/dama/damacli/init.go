package damacli

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// The starter configuration and its example task, which `dama init`
// writes: what a new user runs first, and what the tests run as written.
var (
	//go:embed starter/dama.yaml
	starterConfig string
	//go:embed starter/hello.sh
	starterTask []byte
)

// starterRootUser runs the commands of a starter configuration written by
// root: a supervisor running as root runs none as root unless told.
const starterRootUser = "nobody"

func newInitCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "init [DIR]",
		Short: "Write a starter dama.yaml, with an example kind, in DIR (default: here)",
		Long: `init writes DIR/dama.yaml, a commented configuration that runs as it stands,
and DIR/hello.sh, the command of its example kind hello, which reports its
progress and a checkpoint. Task logs go to DIR/logs. It never overwrites a
file. Then, in DIR:

  dama migrate
  dama supervisor          (in another terminal)
  dama submit hello --wait`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			return writeStarter(cmd, dir)
		},
	}
}

// writeStarter writes the starter files in dir, both or neither.
func writeStarter(cmd *cobra.Command, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("init %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	configPath, taskPath := filepath.Join(abs, "dama.yaml"), filepath.Join(abs, "hello.sh")
	user := "# user: etl    # the OS user the commands run as (default: the supervisor's)"
	if os.Geteuid() == 0 {
		user = "# A supervisor running as root runs no command as root unless told:\n" +
			"# the commands run as this user, which must be able to read hello.sh.\n" +
			"user: " + starterRootUser
	}
	config := strings.NewReplacer("{{user}}", user, "{{command}}", strconv.Quote(taskPath)).Replace(starterConfig)
	if err := writeNew(taskPath, starterTask, 0o755); err != nil {
		return err
	}
	if err := writeNew(configPath, []byte(config), 0o644); err != nil {
		_ = os.Remove(taskPath)
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "wrote %s and %s\n", configPath, taskPath)
	if closed := closedTo(abs); os.Geteuid() == 0 && closed != "" {
		fmt.Fprintf(out, "# %s is closed to other users: %s cannot run hello.sh; init a directory it can reach, or name another user in dama.yaml\n", closed, starterRootUser)
	}
	if wd, err := os.Getwd(); err != nil || wd != abs {
		fmt.Fprintf(out, "cd %s\n", abs)
	}
	if os.Getenv("DATABASE_URL") == "" {
		fmt.Fprintln(out, "export DATABASE_URL=postgres://USER@HOST/DATABASE   # the database dama keeps its tasks in")
	}
	fmt.Fprint(out, "dama migrate\ndama supervisor          # in another terminal\ndama submit hello --wait\n")
	return nil
}

// writeNew writes a file that must not exist, whole or not at all.
func writeNew(path string, data []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("init: %s exists; it is not overwritten (remove it, or init another directory)", path)
	}
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		// Whatever the umask: root's starter runs hello.sh as another user.
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("init: write %s: %w", path, err)
	}
	return nil
}

// closedTo returns the first directory of dir's path that users other
// than its owner and group may not enter, or "".
func closedTo(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}
