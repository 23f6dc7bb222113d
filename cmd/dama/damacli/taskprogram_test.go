package damacli

import (
	"runtime/debug"
	"testing"
)

// The check of dama-taskrunner's build tells each difference.
func TestSameBuildTellsTheDifference(t *testing.T) {
	t.Parallel()
	mod := func(path, version string) *debug.Module {
		return &debug.Module{Path: path, Version: version, Sum: "h1:" + version}
	}
	ours := func() *debug.BuildInfo {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8", Path: "github.com/dama-etl/dama/cmd/dama",
			Main:     debug.Module{Path: "github.com/dama-etl/dama", Version: "v0.3.0"},
			Deps:     []*debug.Module{mod("github.com/jackc/pgx/v5", "v5.7.0"), mod("github.com/spf13/cobra", "v1.9.0")},
			Settings: []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "0"}, {Key: "vcs.revision", Value: "abc"}},
		}
	}
	theirs := func() *debug.BuildInfo {
		b := ours()
		b.Path = "github.com/dama-etl/dama/cmd/dama-taskrunner"
		b.Deps = b.Deps[:1]
		return b
	}
	if err := sameBuild(ours(), theirs()); err != nil {
		t.Fatalf("the same build: %v", err)
	}
	// The Kubernetes module's dama runs its own dama-taskrunner, not the
	// core module's.
	kube := func(b *debug.BuildInfo, pkg string) *debug.BuildInfo {
		b.Path, b.Main.Path = "github.com/dama-etl/dama/kubernetes/cmd/"+pkg, "github.com/dama-etl/dama/kubernetes"
		return b
	}
	if err := sameBuild(kube(ours(), "dama"), kube(theirs(), "dama-taskrunner")); err != nil {
		t.Errorf("the Kubernetes module's pair: %v", err)
	}
	if err := sameBuild(kube(ours(), "dama"), theirs()); err == nil {
		t.Error("the core's dama-taskrunner taken for the Kubernetes module's")
	}
	// Builds that name neither a version nor a commit cannot be told apart.
	anonymous := func(b *debug.BuildInfo) *debug.BuildInfo {
		b.Main.Version = "(devel)"
		b.Settings = b.Settings[:1]
		return b
	}
	if err := sameBuild(anonymous(ours()), anonymous(theirs())); err == nil {
		t.Error("two builds without a version or commit taken for the same")
	}
	withCommit := func(b *debug.BuildInfo) *debug.BuildInfo {
		b = anonymous(b)
		b.Settings = append(b.Settings, debug.BuildSetting{Key: "-ldflags", Value: "-X github.com/dama-etl/dama/version.commit=abc"})
		return b
	}
	if err := sameBuild(withCommit(ours()), withCommit(theirs())); err != nil {
		t.Errorf("two builds of one commit set by the linker: %v", err)
	}
	for name, change := range map[string]func(*debug.BuildInfo){
		"another command": func(b *debug.BuildInfo) { b.Path = "github.com/dama-etl/dama/cmd/sample-etl" },
		"another Go":      func(b *debug.BuildInfo) { b.GoVersion = "go1.26.7" },
		"another version": func(b *debug.BuildInfo) { b.Main.Version = "v0.2.0" },
		"another commit":  func(b *debug.BuildInfo) { b.Settings[1].Value = "def" },
		"a setting more": func(b *debug.BuildInfo) {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: "-race", Value: "true"})
		},
		"a setting less":     func(b *debug.BuildInfo) { b.Settings = b.Settings[:1] },
		"another dependency": func(b *debug.BuildInfo) { b.Deps[0] = mod("github.com/jackc/pgx/v5", "v5.7.1") },
		"a dependency more":  func(b *debug.BuildInfo) { b.Deps = append(b.Deps, mod("example.com/x", "v1.0.0")) },
		"a replaced one": func(b *debug.BuildInfo) {
			b.Deps[0].Replace = mod("../pgx", "(devel)")
		},
	} {
		b := theirs()
		change(b)
		if err := sameBuild(ours(), b); err == nil {
			t.Errorf("%s: taken for the same build", name)
		}
	}
}
