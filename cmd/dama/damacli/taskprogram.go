package damacli

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
)

// taskProgramName is the program of the task processes that a supervisor
// looks for beside its own binary (cmd/dama-taskrunner).
const taskProgramName = "dama-taskrunner"

// taskProgram returns the program the supervisor's task processes run
// (supervisor.Options.Executable): dama-taskrunner beside this binary when
// there is one, else "" (this binary).
func taskProgram() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the dama binary: %w", err)
	}
	path := filepath.Join(filepath.Dir(exe), taskProgramName)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return path, nil
}

// checkTaskProgram refuses a dama-taskrunner of another build than this
// dama's (supervisor.Options.CheckExecutable), read from the file the
// supervisor opened and runs. Refused, not passed over: the supervisor and
// its runners speak one release's protocol, and a half-upgraded install
// would otherwise cost every task its memory savings without a word.
func checkTaskProgram(program *os.File) error {
	ours, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("%s is beside dama, whose build cannot be read to compare: remove it to run task processes with dama itself", program.Name())
	}
	theirs, err := buildinfo.Read(program)
	if err != nil {
		return fmt.Errorf("%s: read its build: %w", program.Name(), err)
	}
	if err := sameBuild(ours, theirs); err != nil {
		return fmt.Errorf("%s is not of this dama's build (%w): install both from one build, or remove it to run task processes with dama itself", program.Name(), err)
	}
	return nil
}

// sameBuild tells whether theirs is dama-taskrunner built as ours was:
// beside dama's own package, from the same module, version and commit,
// with the same Go and settings, and each dependency at ours's version.
func sameBuild(ours, theirs *debug.BuildInfo) error {
	want := path.Join(path.Dir(ours.Path), taskProgramName)
	switch {
	case theirs.Path != want:
		return fmt.Errorf("it is %q, not %s", theirs.Path, want)
	case theirs.GoVersion != ours.GoVersion:
		return fmt.Errorf("built with %s, dama with %s", theirs.GoVersion, ours.GoVersion)
	case theirs.Main != ours.Main:
		return fmt.Errorf("module %s %s, dama's %s %s", theirs.Main.Path, theirs.Main.Version, ours.Main.Path, ours.Main.Version)
	}
	settings := func(info *debug.BuildInfo) map[string]string {
		m := map[string]string{}
		for _, s := range info.Settings {
			m[s.Key] = s.Value
		}
		return m
	}
	o, t := settings(ours), settings(theirs)
	all := maps.Clone(o)
	maps.Copy(all, t)
	for _, k := range slices.Sorted(maps.Keys(all)) {
		if o[k] != t[k] {
			return fmt.Errorf("build setting %s is %q, dama's %q", k, t[k], o[k])
		}
	}
	if !identified(ours) {
		return errors.New("neither names its commit or version, so two builds cannot be told apart: build them in a git checkout, with -ldflags \"-X github.com/dama-etl/dama/version.commit=COMMIT\", or with go install at a version")
	}
	deps := map[string]debug.Module{}
	for _, d := range ours.Deps {
		deps[d.Path] = *d
	}
	for _, d := range theirs.Deps {
		od, ok := deps[d.Path]
		switch {
		case !ok:
			return fmt.Errorf("it has %s, which dama has not", d.Path)
		case od.Version != d.Version || od.Sum != d.Sum || (od.Replace == nil) != (d.Replace == nil) ||
			(od.Replace != nil && *od.Replace != *d.Replace):
			return fmt.Errorf("it has %s %s, dama %s", d.Path, d.Version, od.Version)
		}
	}
	return nil
}

// identified tells whether a build names what it was built from: a
// module version, a VCS revision, or the commit set by the linker.
func identified(info *debug.BuildInfo) bool {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return true
	}
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision" && s.Value != "":
			return true
		case s.Key == "-ldflags" && strings.Contains(s.Value, "version.commit="):
			return true
		}
	}
	return false
}
