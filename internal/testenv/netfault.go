package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Silence makes every TCP connection on the loopback interface with port as
// its source or destination port go silent: its packets are dropped in both
// directions, so neither end sees a FIN or a RST, only a peer that no longer
// answers, as when a network path dies. Use it with the client's ephemeral
// port of one connection to cut that connection alone (SilenceConnection
// finds it); with a Server's port, it cuts every TCP client off that server
// (its Unix socket still answers). restore lets the packets through again;
// it is also called when t ends.
//
// It needs root (nftables); as another user the test is skipped.
func Silence(t testing.TB, port int) (restore func()) {
	t.Helper()
	return silence(t, fmt.Sprintf("port %d", port), "lo", []string{
		fmt.Sprintf("tcp sport %d drop", port),
		fmt.Sprintf("tcp dport %d drop", port),
	})
}

// Querier is what SilenceConnection looks the connection up with: a
// *pgxpool.Pool or a *pgx.Conn on the same server.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SilenceConnection silences the one TCP connection to db's server whose
// backend has the given application_name, waiting up to 10s for it to
// appear, and returns the backend's pid. Unlike Silence, it drops only that
// connection's packets (client port to server port and back), so a
// connection elsewhere that shares the client's port number is untouched.
// db must reach the server over another connection, which stays usable.
func SilenceConnection(t testing.TB, db Querier, applicationName string) (pid int, restore func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var clientPort, serverPort, n int
	for {
		// client_port is -1 on a Unix socket and NULL for a background
		// process: both refused below.
		err := db.QueryRow(ctx, `
SELECT count(*) OVER (), pid, coalesce(client_port, -1), current_setting('port')::int
  FROM pg_stat_activity
 WHERE application_name = $1 AND pid <> pg_backend_pid()
 LIMIT 1`, applicationName).Scan(&n, &pid, &clientPort, &serverPort)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("look up the connection of %q: %v", applicationName, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no backend with application_name %q after 10s", applicationName)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if n != 1 {
		t.Fatalf("%d backends have application_name %q: which one to silence?", n, applicationName)
	}
	if clientPort <= 0 {
		t.Fatalf("backend %d (%q) is not on a TCP connection: only TCP can be silenced", pid, applicationName)
	}
	restore = silence(t, fmt.Sprintf("connection %q (backend %d, 127.0.0.1:%d -> :%d)", applicationName, pid, clientPort, serverPort), "lo", []string{
		fmt.Sprintf("tcp sport %d tcp dport %d drop", clientPort, serverPort),
		fmt.Sprintf("tcp sport %d tcp dport %d drop", serverPort, clientPort),
	})
	return pid, restore
}

// SilenceAddress drops every packet from or to addr, an IPv4 address, on
// every interface, received, sent or forwarded: as when the host at addr
// falls off the network, its peers see no FIN and no RST, only silence.
func SilenceAddress(t testing.TB, addr string) (restore func()) {
	t.Helper()
	if ip := net.ParseIP(addr); ip == nil || ip.To4() == nil {
		t.Fatalf("silence %q: not an IPv4 address", addr)
	}
	return silence(t, "address "+addr, "", []string{"ip saddr " + addr + " drop", "ip daddr " + addr + " drop"})
}

// silence installs rules (nftables statements matched on iface, or on
// every interface and forwarded packets too if it is empty, in both
// directions) in a table of their own, so that concurrent tests never
// touch each other's rules, and returns the function that deletes the
// table.
func silence(t testing.TB, what, iface string, rules []string) (restore func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("silencing a connection needs root: nftables drops its packets on lo")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Fatal("nft not found: install nftables (scripts/test.sh does when run as root)")
	}
	table := "dama_test_" + randomHex(6)
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", table)
	hooks := []string{"input", "output"}
	if iface == "" {
		hooks = append(hooks, "forward")
	}
	for _, hook := range hooks {
		match := ""
		if iface != "" {
			match = fmt.Sprintf("iifname %q ", iface)
			if hook == "output" {
				match = fmt.Sprintf("oifname %q ", iface)
			}
		}
		// Drops in any base chain are final, whatever other tables accept,
		// so the filter priority is enough.
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority filter; policy accept;\n", hook, hook)
		for _, r := range rules {
			fmt.Fprintf(&b, "\t\t%s%s\n", match, r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	if out, err := runNft(nft, b.String(), "-f", "-"); err != nil {
		t.Fatalf("silence %s: %v\n%s\nruleset:\n%s", what, err, out, b.String())
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if out, err := runNft(nft, "", "delete", "table", "inet", table); err != nil {
				t.Errorf("restore %s: delete nftables table %s: %v\n%s", what, table, err, out)
			}
		})
	}
	t.Cleanup(restore)
	return restore
}

func runNft(nft, stdin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nft, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("nft %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}
