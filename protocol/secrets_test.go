package protocol

import (
	"bytes"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// The secrets socket holds its secrets whole before its reader starts, and
// the reader takes nothing that is not NAME=value.
func TestTheSecretsSocket(t *testing.T) {
	want := Secrets{Env: []string{"DATABASE_URL=postgres:///x", "PGSSLMODE=disable"}, RunKey: "r", Keeper: []byte{1, 2}}
	r, err := SecretsSocket(want)
	if err != nil {
		t.Fatal(err)
	}
	// ReadSecrets takes the descriptor: r's own closes first, or its
	// finalizer would close the number later, whatever holds it then.
	fd, err := syscall.Dup(int(r.Fd()))
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadSecrets(fd)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadSecrets = %+v, %v; want %+v", got, err, want)
	}
	if _, err := SecretsSocket(Secrets{Env: []string{"PGX=" + strings.Repeat("x", MaxSecrets)}}); err == nil {
		t.Error("secrets over MaxSecrets were written")
	}
}

// FuzzParseSecrets reads arbitrary secrets: what it takes encodes and
// reads back as itself, and holds nothing a process's environment cannot
// (a password that is not UTF-8 is kept as it is).
func FuzzParseSecrets(f *testing.F) {
	for _, m := range []string{
		"k\x00abcd\x00DATABASE_URL=postgres://u:p@h/db\x00PGPASSWORD=\xff\xfe=\x00",
		"\x00\x00",
		"k\x00zz\x00",
		"k\x00\x00=x\x00",
		"k\x00\x00NOEQUALS\x00",
		"k\x00\x00A=b",
		"\x00",
		"",
	} {
		f.Add([]byte(m))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		s, err := parseSecrets(msg)
		if err != nil {
			if s.Env != nil || s.RunKey != "" || s.Keeper != nil || err.Error() == "" {
				t.Fatalf("parseSecrets(%q) = %+v, %q: want nothing and a message", msg, s, err)
			}
			return
		}
		for _, kv := range s.Env {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsRune(kv, 0) {
				t.Fatalf("parseSecrets(%q) took %q", msg, kv)
			}
		}
		b, err := s.encode()
		if err != nil {
			t.Fatalf("parseSecrets(%q) = %+v, which does not encode: %v", msg, s, err)
		}
		if again, err := parseSecrets(b); err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("parseSecrets(%q) = %+v, which reads back as %+v, %v", msg, s, again, err)
		}
	})
}

// A Secrets printed or logged, alone or in a struct, shows none of them.
func TestSecretsShowNothingPrintedOrLogged(t *testing.T) {
	s := Secrets{Env: []string{"DATABASE_URL=postgres://u:hunter2@h/db"}, RunKey: "runkey", Keeper: []byte("keeper")}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("launch", "secrets", s, "in", struct{ S Secrets }{s})
	for _, shown := range []string{fmt.Sprint(s), fmt.Sprintf("%+v %#v", struct{ S Secrets }{s}, s), logged.String()} {
		for _, secret := range []string{"hunter2", "runkey", "keeper", "107 101"} {
			if strings.Contains(shown, secret) {
				t.Errorf("%q shows %q", shown, secret)
			}
		}
	}
}
