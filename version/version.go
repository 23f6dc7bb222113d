// Package version tells which release of dama a binary is.
//
// A release is cut by setting Release to its vMAJOR.MINOR.PATCH and
// recording the commit in CHANGELOG.md; between releases Release names the
// next one with a "-dev" suffix. The commit comes from the build: the Go
// toolchain stamps it when it builds inside a git checkout, and a build from
// an exported tree sets it with
//
//	go build -ldflags "-X github.com/dama-etl/dama/version.commit=<sha>" ./cmd/dama
package version

import "runtime/debug"

// Release is this build's release, vMAJOR.MINOR.PATCH (Semantic Versioning);
// a "-dev" suffix marks a build between releases.
const Release = "v0.2.0-dev"

// commit is set by the linker (-X) when the build has no VCS stamp.
var commit string

// Commit returns the commit the binary was built from, with "-dirty" when
// the tree had local changes, or "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	vcs := map[string]string{}
	for _, s := range info.Settings {
		vcs[s.Key] = s.Value
	}
	switch rev := vcs["vcs.revision"]; {
	case rev == "":
		return "unknown"
	case vcs["vcs.modified"] == "true":
		return rev + "-dirty"
	default:
		return rev
	}
}
