package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// docPage is the page whose deployment TestTheDocDeploysOnKubernetes runs.
const docPage = "../docs/kubernetes.md"

// docNamespaces are the namespaces the page's steps make
// (deploy/kubernetes-hardened/namespaces.yaml): a run's are deleted
// before and after it.
var docNamespaces = []string{"dama", "dama-tasks"}

// fencedBlocks returns the bodies of page's fenced blocks whose info
// string is lang, in order.
func fencedBlocks(t *testing.T, page, lang string) []string {
	t.Helper()
	body, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var block *strings.Builder
	for line := range strings.Lines(string(body)) {
		switch fence := strings.TrimRight(line, "\n"); {
		case block == nil && fence == "```"+lang:
			block = &strings.Builder{}
		case block == nil:
		case fence == "```":
			blocks = append(blocks, block.String())
			block = nil
		default:
			block.WriteString(line)
		}
	}
	if block != nil {
		t.Fatalf("%s: a %s block is not closed", page, lang)
	}
	return blocks
}

// heredoc is the start of a here-document, and its delimiter.
var heredoc = regexp.MustCompile(`<<-?\s*['"]?(\w+)['"]?`)

// shellCommands splits a block of shell into its commands, as a reader
// copies them: a line, with the lines a trailing backslash or a
// here-document joins to it. Comments and blank lines are left out.
func shellCommands(block string) []string {
	var cmds []string
	var cmd []string
	end := ""
	for line := range strings.Lines(block) {
		line = strings.TrimRight(line, "\n")
		switch {
		case end != "":
			cmd = append(cmd, line)
			if line == end {
				end = ""
			}
		case len(cmd) == 0 && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")):
			continue
		default:
			cmd = append(cmd, line)
			if m := heredoc.FindStringSubmatch(line); m != nil {
				end = m[1]
			}
		}
		if end == "" && !strings.HasSuffix(line, `\`) {
			cmds = append(cmds, strings.Join(cmd, "\n"))
			cmd = nil
		}
	}
	return cmds
}

// TestTheDocDeploysOnKubernetes deploys dama as docs/kubernetes.md says,
// on scripts/kube.sh's cluster: every sh block of the page, command by
// command, in one bash, from the checkout, on a database of its own that
// the page's Job migrates. Then: the supervisor works as the page's login
// of dama_supervisor, and the task the page submitted ran in the tasks'
// namespace. And the page's overlay names dama's image once, for every
// place that runs it.
func TestTheDocDeploysOnKubernetes(t *testing.T) {
	addr, password := os.Getenv(kubeDBAddrEnv), os.Getenv(kubeDBPasswordEnv)
	if addr == "" || os.Getenv("KUBECONFIG") == "" {
		t.Skip("no cluster: scripts/test-kubernetes.sh runs the tests on Kubernetes")
	}
	ctx := context.Background()

	t.Run("the overlay names the image once", func(t *testing.T) {
		var overlay string
		for _, b := range fencedBlocks(t, docPage, "yaml") {
			if strings.HasPrefix(b, "# my-dama/kustomization.yaml\n") {
				overlay = b
			}
		}
		if overlay == "" {
			t.Fatalf("%s has no yaml block for my-dama/kustomization.yaml", docPage)
		}
		dir := t.TempDir()
		repo, err := filepath.Abs("..")
		if err != nil {
			t.Fatal(err)
		}
		hardened, err := os.ReadFile(filepath.Join(repo, "deploy", "kubernetes-hardened", "dama.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(repo, filepath.Join(dir, "dama")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, "my-dama"), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string][]byte{"kustomization.yaml": []byte(overlay), "dama.yaml": hardened} {
			if err := os.WriteFile(filepath.Join(dir, "my-dama", name), content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.CommandContext(ctx, "kubectl", "kustomize", filepath.Join(dir, "my-dama")).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize my-dama: %v\n%s", err, out)
		}
		images := regexp.MustCompile(`(?m)^\s*(?:- )?image: (\S+)$|name: DAMA_IMAGE\n\s*value: (\S+)`).FindAllSubmatch(out, -1)
		var named []string
		for _, m := range images {
			named = append(named, string(m[1])+string(m[2]))
		}
		slices.Sort(named)
		// The supervisor's container and its DAMA_IMAGE, the migration's.
		if want := []string{"registry.example/dama:1.4", "registry.example/dama:1.4", "registry.example/dama:1.4"}; !slices.Equal(named, want) {
			t.Errorf("the overlay's images %q, want %q", named, want)
		}
	})

	env := testenv.NewUnmigrated(t)
	kubectl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "kubectl", args...).CombinedOutput()
		return string(out), err
	}
	deleteNamespaces := func() {
		if out, err := kubectl(append([]string{"delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=2m"}, docNamespaces...)...); err != nil {
			t.Errorf("delete the page's namespaces: %v\n%s", err, out)
		}
	}
	// The page's logins are the server's: none of a run killed before.
	var logins []string
	for _, block := range fencedBlocks(t, docPage, "sh") {
		for _, m := range regexp.MustCompile(`CREATE ROLE (\w+)`).FindAllStringSubmatch(block, -1) {
			logins = append(logins, m[1])
		}
	}
	dropLogins := func() {
		for _, name := range logins {
			if _, err := env.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name); err != nil {
				t.Errorf("end the sessions of %s: %v", name, err)
			}
			if _, err := env.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+name); err != nil {
				t.Errorf("drop the page's login %s: %v", name, err)
			}
		}
	}
	deleteNamespaces()
	dropLogins()
	t.Cleanup(dropLogins)
	t.Cleanup(func() {
		if t.Failed() {
			for _, ns := range docNamespaces {
				pods, _ := kubectl("-n", ns, "get", "pods", "-o", "wide")
				events, _ := kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp")
				t.Logf("namespace %s's pods:\n%s\nits events:\n%s", ns, pods, events)
			}
			logs, _ := kubectl("-n", "dama", "logs", "-l", "app.kubernetes.io/component=supervisor", "--tail=40", "--prefix")
			t.Logf("the supervisor's log:\n%s", logs)
		}
		deleteNamespaces()
	})

	// What the page asks of its reader: the database as the pods reach
	// it, its owner's URL, and psql connected as that owner.
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	var shellEnv []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "DATABASE_URL" && !strings.HasPrefix(k, "DAMA_") && !strings.HasPrefix(k, "PG") {
			shellEnv = append(shellEnv, kv)
		}
	}
	shellEnv = append(shellEnv,
		"DB="+addr+"/"+name+"?sslmode=disable",
		"OWNER_URL="+fmt.Sprintf("postgres://postgres:%s@%s/%s?sslmode=disable", url.QueryEscape(password), addr, name),
		"PGHOST="+u.Query().Get("host"), "PGPORT="+u.Query().Get("port"), "PGUSER="+u.User.Username(), "PGDATABASE="+name)

	// The page's commands, each announced by a mark with the time it
	// starts at, in one script: one shell, as a reader's.
	var cmds []string
	for _, block := range fencedBlocks(t, docPage, "sh") {
		cmds = append(cmds, shellCommands(block)...)
	}
	if len(cmds) < 10 {
		t.Fatalf("%s has %d commands in sh blocks: %q", docPage, len(cmds), cmds)
	}
	const mark = "\x1edoc-command "
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for i, c := range cmds {
		fmt.Fprintf(&script, "printf '%s%d %%s\\n' \"$EPOCHREALTIME\"\n%s\n", mark, i, c)
	}
	fmt.Fprintf(&script, "printf '%s%d %%s\\n' \"$EPOCHREALTIME\"\n", mark, len(cmds))
	path := filepath.Join(env.Dir, "doc.sh")
	if err := os.WriteFile(path, []byte(script.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// The page's commands take about a minute, and the image's build
	// as long again with Go's cache warm.
	runCtx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	sh := exec.CommandContext(runCtx, "bash", path)
	sh.Dir = ".."
	sh.Env = shellEnv
	// A command that hangs (a task that is never DONE) is stopped with
	// its shell and everything else the shell started.
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
	sh.WaitDelay = 10 * time.Second
	out, runErr := sh.CombinedOutput()

	// Each command, its time and its output.
	var last int
	var began float64
	var output bytes.Buffer
	flush := func() {
		if last < len(cmds) {
			t.Logf("$ %s\n%s", cmds[last], output.String())
		}
		output.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, mark)
		if !ok {
			output.WriteString(line + "\n")
			continue
		}
		i, at, _ := strings.Cut(rest, " ")
		n, _ := strconv.Atoi(i)
		secs, _ := strconv.ParseFloat(at, 64)
		if n > 0 {
			fmt.Fprintf(&output, "(%.1fs)\n", secs-began)
			flush()
		}
		last, began = n, secs
	}
	if runErr != nil {
		flush()
		if last < len(cmds) {
			t.Fatalf("the page's command %d of %d failed (%v):\n%s", last+1, len(cmds), runErr, cmds[last])
		}
		t.Fatalf("the page's commands: %v", runErr)
	}

	// The supervisor works as the page's login of dama_supervisor, and
	// the task ran in the tasks' namespace, at its first attempt.
	var sessions int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND usename = 'etl_sup' AND application_name LIKE 'dama-supervisor-liveness:%'`).Scan(&sessions); err != nil || sessions != 1 {
		t.Errorf("the supervisor's liveness sessions as etl_sup: %d (%v), want 1", sessions, err)
	}
	var id int64
	if err := env.Pool.QueryRow(ctx, `SELECT etl_context_id FROM data_manager.etl_contexts WHERE kind = 'hello'`).Scan(&id); err != nil {
		t.Fatalf("the page's task: %v", err)
	}
	task := env.WaitForTask(id, time.Minute, "", func(etlcontext.Task) bool { return true })
	if task.Status != etlcontext.StatusDone || task.Attempt != 1 {
		t.Errorf("the page's task %d: %s at attempt %d, want DONE at attempt 1", id, task.Status, task.Attempt)
	}
	if pods, err := kubectl("-n", "dama-tasks", "get", "pods", "-o", "name", "-l", "dama.dev/task="+strconv.FormatInt(id, 10)); err != nil || strings.Count(pods, "pod/") != 1 {
		t.Errorf("the task's pods in dama-tasks: %v %q, want one", err, pods)
	}
}
