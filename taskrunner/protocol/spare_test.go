package protocol

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair returns the two ends of a spare's socket.
func socketPair(t *testing.T) (supervisor, spare *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// As a supervisor has it: non-blocking, for deadlines.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	supervisor, spare = os.NewFile(uintptr(fds[0]), "supervisor"), os.NewFile(uintptr(fds[1]), "spare")
	t.Cleanup(func() { supervisor.Close(); spare.Close() })
	return supervisor, spare
}

func TestASpareReceivesItsLaunchAndLogFile(t *testing.T) {
	sup, spare := socketPair(t)
	logPath := filepath.Join(t.TempDir(), "42.log")
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	want := Launch{ContextID: 42, RunID: "7f3c9a12-0b1e-4c55-9d0e-2a6f1e8b4c01", LockMode: LockModeHost}
	// Descriptors of the supervisor's are not the spare's: not sent.
	sent := want
	sent.ReadyFD, sent.SecretsFD = 3, 4
	if err := SendLaunch(sup, sent, log); err != nil {
		t.Fatal(err)
	}
	got, f, err := ReceiveLaunch(int(spare.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got != want {
		t.Fatalf("received %+v, want %+v", got, want)
	}
	if _, err := f.WriteString("from the spare\n"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(logPath); string(data) != "from the spare\n" {
		t.Fatalf("the log file holds %q", data)
	}
	if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("the received log file is inherited by what the spare starts: flags %d, %v", fl, err)
	}
}

func TestASpareWhoseSupervisorIsGoneGetsNoLaunch(t *testing.T) {
	sup, spare := socketPair(t)
	sup.Close()
	if _, _, err := ReceiveLaunch(int(spare.Fd())); !errors.Is(err, ErrNoLaunch) {
		t.Fatalf("ReceiveLaunch after the supervisor closed its end: %v, want ErrNoLaunch", err)
	}
}

func TestASpareRefusesALaunchWithoutItsLogFileAlone(t *testing.T) {
	for _, fds := range [][]int{nil, {0, 1}} {
		sup, spare := socketPair(t)
		var oob []byte
		if fds != nil {
			oob = unix.UnixRights(fds...)
		}
		msg := []byte(`{"context_id":42,"run_id":"r","lock_mode":"row"}`)
		if err := unix.Sendmsg(int(sup.Fd()), msg, oob, nil, 0); err != nil {
			t.Fatal(err)
		}
		if l, f, err := ReceiveLaunch(int(spare.Fd())); err == nil {
			f.Close()
			t.Fatalf("%d descriptors: received %+v, want an error", len(fds), l)
		}
	}
}

func TestASpareGetsItsSecretsOnItsSocketAfterItsHello(t *testing.T) {
	sup, spare := socketPair(t)
	if err := SendHello(int(spare.Fd())); err != nil {
		t.Fatal(err)
	}
	if err := AwaitHello(sup, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	key := strings.Repeat("0123456789abcdef", 4)
	want := Secrets{Env: []string{"DATABASE_URL=postgres://u:p@h/db", "PGPASSWORD=a=b\xff"}, RunKey: key, Keeper: []byte("k\x00\xff")}
	if err := SendSecrets(sup, want); err != nil {
		t.Fatal(err)
	}
	if got, err := ReceiveSecrets(int(spare.Fd())); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReceiveSecrets = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", key[:63], key + "0", strings.ToUpper(key), strings.Repeat("g", 64)} {
		if err := SendSecrets(sup, Secrets{RunKey: bad}); err == nil {
			t.Errorf("SendSecrets sent a key that is not one, %q", bad)
		}
		if err := checkRunKey(bad); err == nil {
			t.Errorf("checkRunKey(%q) accepted a key that is not one", bad)
		}
	}
	sup.Close()
	if _, err := ReceiveSecrets(int(spare.Fd())); !errors.Is(err, ErrNoLaunch) {
		t.Fatalf("ReceiveSecrets after the supervisor closed its end: %v, want ErrNoLaunch", err)
	}
}
