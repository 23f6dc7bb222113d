package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// scripts/image.sh makes an OCI archive whose digests are its blobs', whose
// image runs /dama as uid 65532, and whose dama runs.
func TestTheImageIsAnOCIArchiveOfDama(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "image.tar")
	script, err := filepath.Abs(filepath.Join("..", "scripts", "image.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(script, out, "docker.io/library/dama:test").CombinedOutput(); err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, b)
	}
	f, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(f))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
	type descriptor struct {
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations"`
	}
	// blob returns the blob d names, checking its digest and size.
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		sum := sha256.Sum256(b)
		if !ok || "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || len(b) != d.Size {
			t.Fatalf("blob %s (%d bytes): missing or not what it says", d.Digest, d.Size)
		}
		return b
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v: %s", err, files["index.json"])
	}
	if name := index.Manifests[0].Annotations["io.containerd.image.name"]; name != "docker.io/library/dama:test" {
		t.Errorf("the image is named %q", name)
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(blob(index.Manifests[0]), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config struct {
		Config struct {
			Entrypoint []string
			User       string
		}
	}
	if err := json.Unmarshal(blob(manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if strings.Join(config.Config.Entrypoint, " ") != "/dama" || config.Config.User != "65532:65532" {
		t.Errorf("the image runs %v as %q, want /dama as 65532:65532", config.Config.Entrypoint, config.Config.User)
	}
	// Its dama, taken out of the layer, runs.
	layer := tar.NewReader(bytes.NewReader(blob(manifest.Layers[0])))
	var names []string
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "./dama-taskrunner" {
			b, _ := io.ReadAll(layer)
			if err := os.WriteFile(filepath.Join(dir, "dama-taskrunner"), b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if h.Name == "./dama" {
			bin := filepath.Join(dir, "dama")
			b, _ := io.ReadAll(layer)
			if err := os.WriteFile(bin, b, 0o755); err != nil {
				t.Fatal(err)
			}
			// A process this test binary forks meanwhile, for another
			// test, holds the file open for writing until it execs:
			// "text file busy" until then (go.dev/issue/22315).
			var v []byte
			testenv.Eventually(t, 10*time.Second, "the image's dama to run", func() (bool, error) {
				v, err = exec.Command(bin, "version").Output()
				return !errors.Is(err, syscall.ETXTBSY), err
			})
			if err != nil || !strings.Contains(string(v), "protocol ") {
				t.Errorf("the image's dama version: %v: %s", err, v)
			}
		}
	}
	for _, want := range []string{"./dama", "./dama-taskrunner", "./dama-shim", "./etc/passwd", "./tmp/"} {
		if !strings.Contains(strings.Join(names, " ")+" ", want+" ") {
			t.Fatalf("the layer has no %s: %v", want, names)
		}
	}
	// Its supervisor runs its task processes with the dama-taskrunner
	// beside it, which it checks is of its own build.
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  hello: { command: ["{{sample}}"] }
`)
	p := env.StartProgram(filepath.Join(dir, "dama"), cfg, "supervisor")
	p.WaitReady(t, time.Minute)
	p.Kill(t, syscall.SIGTERM)
}
