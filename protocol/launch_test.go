package protocol

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzParseLaunch reads arbitrary runner command lines (the arguments
// NUL-separated in one string: no argument can hold a NUL), and the command
// line of an arbitrary Launch, which must read back as that Launch.
func FuzzParseLaunch(f *testing.F) {
	join := func(l Launch) string { return strings.Join(l.Args()[1:], "\x00") }
	for _, s := range []struct {
		argv   string
		launch Launch
	}{
		{join(Launch{ContextID: 42, RunID: "7f3c9a12-0b1e-4c55-9d0e-2a6f1e8b4c01", LockMode: LockModeRow, ReadyFD: 3}), Launch{ContextID: 42, RunID: "r", LockMode: LockModeRow}},
		{join(Launch{ContextID: 1<<63 - 1, RunID: "-x", LockMode: LockModeAdvisory}), Launch{ContextID: 1, RunID: "--context-id", LockMode: LockModeAdvisory, ReadyFD: 1 << 40}},
		{"--context-id=5\x00--run-id=r", Launch{ContextID: 5, RunID: "=", LockMode: LockModeRow, ReadyFD: -1}},
		{"-context-id\x000x10\x00-run-id\x00r\x00-lock-mode\x00advisory", Launch{ContextID: -1, RunID: "r", LockMode: LockModeRow}},
		{"--context-id\x000\x00--run-id\x00r", Launch{ContextID: 2, RunID: "", LockMode: LockModeRow}},
		{"--context-id\x0042\x00--run-id\x00r\x00--lock-mode\x00ROW", Launch{ContextID: 2, RunID: "r", LockMode: "ROW"}},
		{"--context-id\x0042\x00--run-id\x00r\x00--ready-fd\x00-3", Launch{ContextID: 2, RunID: "a b\nc", LockMode: LockModeAdvisory, ReadyFD: 4}},
		{"--context-id\x0042\x00--run-id\x00r\x00extra", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--\x00extra", Launch{}},
		{"--context-id\x0099999999999999999999\x00--run-id\x00r", Launch{}},
		{"--context-id", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--ready-fd\x004\x00--secrets-fd\x004", Launch{}},
		{join(Launch{ContextID: 42, RunID: "r", LockMode: LockModeAdvisory, SecretsFile: "/var/run/dama/secrets", SecretsDigest: strings.Repeat("0a", 32)}), Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--secrets-file\x00/s", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--secrets-digest\x00ab", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--shim-socket\x00shim.sock", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--shim-socket\x00/s\x00--lock-mode\x00host", Launch{}},
		{"--context-id\x0042\x00--run-id\x00r\x00--secrets-file\x00/s\x00--secrets-fd\x005", Launch{}},
		{"-h", Launch{}},
		{"--unknown", Launch{}},
		{"", Launch{}},
	} {
		l := s.launch
		f.Add(s.argv, l.ContextID, l.RunID, string(l.LockMode), l.ReadyFD)
	}
	f.Fuzz(func(t *testing.T, argv string, contextID int64, runID, lockMode string, readyFD int) {
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\x00")
		}
		if l, err := ParseLaunch(args); err != nil {
			if l != (Launch{}) || err.Error() == "" {
				t.Fatalf("ParseLaunch(%q) = %+v, %q: want nothing and a message", args, l, err)
			}
		} else {
			switch {
			case l.ContextID <= 0 || l.RunID == "":
				t.Fatalf("ParseLaunch(%q) = %+v: want a context and a run", args, l)
			case !l.LockMode.Valid():
				t.Fatalf("ParseLaunch(%q) = %+v: lock mode %q", args, l, l.LockMode)
			case l.ReadyFD != 0 && l.ReadyFD < 3, l.SecretsFD != 0 && l.SecretsFD < 3:
				t.Fatalf("ParseLaunch(%q) = %+v: a descriptor the runner must not read or close", args, l)
			case l.ReadyFD != 0 && l.ReadyFD == l.SecretsFD:
				t.Fatalf("ParseLaunch(%q) = %+v: one descriptor for the ready byte and the secrets", args, l)
			case l.SecretsFile != "" && l.SecretsFD != 0:
				t.Fatalf("ParseLaunch(%q) = %+v: secrets from two places", args, l)
			case (l.SecretsFile != "") != (l.SecretsDigest != ""):
				t.Fatalf("ParseLaunch(%q) = %+v: a secrets file without its digest, or a digest without a file", args, l)
			}
			want := l
			if again, err := ParseLaunch(l.Args()[1:]); err != nil || !reflect.DeepEqual(again, want) {
				t.Fatalf("ParseLaunch(%q) = %+v, whose Args read back as %+v, %v", args, l, again, err)
			}
		}

		// What a supervisor launches, the runner reads: any run id, any
		// descriptor.
		l := Launch{ContextID: contextID, RunID: runID, LockMode: LockMode(lockMode), ReadyFD: readyFD}
		if l.ContextID <= 0 || l.RunID == "" || strings.Contains(l.RunID, "\x00") ||
			(l.LockMode != LockModeRow && l.LockMode != LockModeAdvisory) ||
			(l.ReadyFD > 0 && l.ReadyFD < 3) {
			// A supervisor hands descriptors above 2 (ReadyFD, SecretsFD).
			return
		}
		if l.Args()[0] != Subcommand {
			t.Fatalf("Args() = %q: want %s first", l.Args(), Subcommand)
		}
		want := l
		want.ReadyFD = max(want.ReadyFD, 0)
		if got, err := ParseLaunch(l.Args()[1:]); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("Launch %+v: its Args %q read back as %+v, %v", l, l.Args(), got, err)
		}
	})
}

func TestLaunchArgsRoundTrip(t *testing.T) {
	want := Launch{ContextID: 42, RunID: "r-1", LockMode: "advisory", ReadyFD: 3}
	args := want.Args()
	if args[0] != Subcommand {
		t.Fatalf("args %v: want %s first", args, Subcommand)
	}
	got, err := ParseLaunch(args[1:])
	if err != nil || got != want {
		t.Errorf("ParseLaunch(%v) = %+v, %v: want %+v", args[1:], got, err, want)
	}
	// What a v0.1.0 supervisor passes to the binary at its path, which may
	// be this release's after a redeploy.
	v010 := []string{"--context-id", "42", "--run-id", "r-1", "--lock-mode", "advisory", "--ready-fd", "3"}
	if got, err := ParseLaunch(v010); err != nil || got != want {
		t.Errorf("ParseLaunch(%v) = %+v, %v: want %+v", v010, got, err, want)
	}
	for _, bad := range [][]string{
		{"--run-id", "r"},
		{"--context-id", "1"},
		{"--context-id", "1", "--run-id", "r", "--lock-mode", "table"},
		{"--context-id", "1", "--run-id", "r", "extra"},
		{"--context-id", "x", "--run-id", "r"},
		{"--context-id", "1", "--run-id", "r", "--secrets-fd", "-1"},
		{"--context-id", "1", "--run-id", "r", "--secrets-fd", "1"},
		{"--context-id", "1", "--run-id", "r", "--ready-fd", "2"},
	} {
		if _, err := ParseLaunch(bad); err == nil {
			t.Errorf("ParseLaunch(%v): no error", bad)
		}
	}
}

// FuzzParseKeeperLaunch reads arbitrary keeper command lines (NUL-separated
// as above), and the command line of an arbitrary KeeperLaunch, which must
// read back as that KeeperLaunch when it is valid.
func FuzzParseKeeperLaunch(f *testing.F) {
	for _, s := range []struct {
		argv      string
		socket    string
		heartbeat int64
	}{
		{"--socket\x00/var/log/dama/.keeper/ab-v3.sock\x00--heartbeat\x005s\x00--secrets-fd\x003", "/tmp/k.sock", int64(time.Second)},
		{"--socket=/x\x00--heartbeat=200ms\x00--secrets-fd=3", "relative.sock", 1},
		{"--socket\x00\x00--heartbeat\x001s", "", 0},
		{"--socket\x00/x\x00--heartbeat\x00-1s", "/a b\nc", -5},
		{"--socket\x00/x\x00--heartbeat\x0099999999999h", "/x", 1 << 62},
		{"--socket\x00/x\x00--heartbeat\x001s\x00extra", "/x", 1},
		{"--socket\x00/x\x00--heartbeat\x001s\x00--secrets-fd\x003", "/x", 1},
		{"--socket\x00/x\x00--heartbeat\x001s\x00--secrets-fd\x001", "/x", 1},
		{"-h", "", 0},
		{"", "", 0},
	} {
		f.Add(s.argv, s.socket, s.heartbeat)
	}
	f.Fuzz(func(t *testing.T, argv, socket string, heartbeat int64) {
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\x00")
		}
		if l, err := ParseKeeperLaunch(args); err != nil {
			if l != (KeeperLaunch{}) || err.Error() == "" {
				t.Fatalf("ParseKeeperLaunch(%q) = %+v, %q: want nothing and a message", args, l, err)
			}
		} else {
			if !strings.HasPrefix(l.Socket, "/") || l.Heartbeat <= 0 || l.SecretsFD < 3 {
				t.Fatalf("ParseKeeperLaunch(%q) = %+v: want an absolute socket and a heartbeat", args, l)
			}
			if again, err := ParseKeeperLaunch(l.Args()[1:]); err != nil || again != l {
				t.Fatalf("ParseKeeperLaunch(%q) = %+v, whose Args read back as %+v, %v", args, l, again, err)
			}
		}
		l := KeeperLaunch{Socket: socket, Heartbeat: time.Duration(heartbeat), SecretsFD: KeeperSecretsFD}
		if strings.ContainsRune(socket, 0) {
			return
		}
		got, err := ParseKeeperLaunch(l.Args()[1:])
		valid := strings.HasPrefix(socket, "/") && heartbeat > 0
		if valid && (err != nil || got != l) {
			t.Fatalf("%+v reads back as %+v, %v", l, got, err)
		}
		if !valid && err == nil {
			t.Fatalf("%+v, not a keeper's, reads back as %+v", l, got)
		}
	})
}
