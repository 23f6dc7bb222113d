package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Release is a release recorded in CHANGELOG.md.
type Release struct {
	// Version is vMAJOR.MINOR.PATCH.
	Version string
	// Commit is the commit it was cut from.
	Commit string
}

var (
	releaseHeading = regexp.MustCompile(`^## \[(\d+\.\d+\.\d+)\]`)
	releaseCommit  = regexp.MustCompile("^Commit: `?([0-9a-f]{40})`?")
)

// Releases returns the releases CHANGELOG.md records, newest first.
func Releases() ([]Release, error) {
	f, err := os.Open(filepath.Join(moduleRoot(), "CHANGELOG.md"))
	if err != nil {
		return nil, fmt.Errorf("read the changelog: %w", err)
	}
	defer f.Close()
	var (
		out     []Release
		current string
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := releaseHeading.FindStringSubmatch(line); m != nil {
			current = "v" + m[1]
			continue
		}
		if m := releaseCommit.FindStringSubmatch(line); m != nil && current != "" {
			out = append(out, Release{Version: current, Commit: m[1]})
			current = ""
		}
	}
	return out, sc.Err()
}

// PreviousRelease returns the newest release of CHANGELOG.md cut from a
// commit before HEAD, in HEAD's own history: the release the code at HEAD
// upgrades from.
func PreviousRelease(t testing.TB) Release {
	t.Helper()
	releases, err := Releases()
	if err != nil {
		t.Fatal(err)
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		t.Fatalf("find HEAD: %v", err)
	}
	for _, r := range releases {
		if r.Commit == head {
			continue
		}
		if _, err := git("merge-base", "--is-ancestor", r.Commit, "HEAD"); err != nil {
			if _, missing := git("cat-file", "-e", r.Commit+"^{commit}"); missing != nil {
				t.Fatalf("release %s: commit %s is not in this clone (a shallow clone? fetch the full history)", r.Version, r.Commit)
			}
			continue
		}
		return r
	}
	t.Fatal("CHANGELOG.md records no release before HEAD")
	return Release{}
}

// BuildRelease builds the dama binary of release r from the repository's
// own history (git archive of its commit) and returns its path; the
// build's tree is removed when the test ends.
func BuildRelease(t testing.TB, r Release) string {
	t.Helper()
	src := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", r.Commit)
	archive.Dir = moduleRoot()
	extract := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var archiveErr, extractErr strings.Builder
	archive.Stderr, extract.Stderr = &archiveErr, &extractErr
	if err := extract.Start(); err != nil {
		t.Fatalf("extract release %s: %v", r.Version, err)
	}
	if err := archive.Run(); err != nil {
		_ = extract.Wait()
		t.Fatalf("git archive %s (%s): %v: %s", r.Commit, r.Version, err, archiveErr.String())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("extract release %s: %v: %s", r.Version, err, extractErr.String())
	}
	bin := filepath.Join(t.TempDir(), "dama-"+r.Version)
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/dama-etl/dama/version.commit="+r.Commit, "./cmd/dama")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build release %s: %v\n%s", r.Version, err, out)
	}
	return bin
}

// git runs git in the module's checkout and returns its trimmed output.
func git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = moduleRoot()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", errors.Join(fmt.Errorf("git %s: %w", strings.Join(args, " "), err), errors.New(strings.TrimSpace(stderr.String())))
	}
	return strings.TrimSpace(string(out)), nil
}
