package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// What a command writes (an event's payload, a progress dama cannot read,
// a failure's reason, its output) drives no operator's terminal: every
// command that prints it shows its escape sequences, C1 controls and bidi
// overrides rather than send them. Reproduced before: a note event
// cleared the screen and set the title through dama events, and a
// progress payload wrote the clipboard (OSC 52) through dama status.
func TestNothingACommandWritesDrivesATerminal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// As JSON on the events pipe, and as bytes on stdout: ESC ] (OSC), a
	// CSI dama never writes itself (reverse video), a C1 CSI, a
	// right-to-left override, a zero-width space.
	const evil = `\u001b]52;c;aGk=\u0007\u001b]0;pwned\u0007\u001b[7m\u009b2J\u202eevil\u200b`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 200ms
kinds:
  rogue:
    max_attempts: 1
    command:
      - /bin/sh
      - -c
      - |
        printf '%s\n' '{"type": "note", "payload": {"m": "` + evil + `"}}' >&3
        printf '%s\n' '{"type": "progress", "payload": {"stage": "` + evil + `"}}' >&3
        printf '%s\n' '{"type": "failure", "payload": {"error": "` + evil + `"}}' >&3
        printf 'out \033]0;pwned\007 \033[7m \302\233 \342\200\256 end\n'
        exit 3
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("rogue")
	w.waitFinished(id, time.Minute)
	sid := strconv.FormatInt(id, 10)

	// driving says what in out a terminal would act on: dama's own
	// redrawing (ESC [) aside on a terminal.
	driving := func(out string, tty bool) string {
		switch {
		case strings.Contains(out, "\x1b]"):
			return "an OSC sequence"
		case strings.Contains(out, "\x1b[7m"):
			return "the command's CSI sequence"
		case !tty && strings.Contains(out, "\x1b"):
			return "an ESC"
		case strings.ContainsAny(out, "\u009b\u0090\u009d\u202e\u200b"):
			return "a C1 control or a format character"
		}
		return ""
	}
	for _, args := range [][]string{
		{"events", sid}, {"events", sid, "--json"},
		{"status"}, {"status", "-o", "wide"}, {"status", "--json"}, {"status", sid},
	} {
		res := w.Dama(cfg, args...)
		if what := driving(res.Stdout+res.Stderr, false); what != "" || res.Code != 0 {
			t.Errorf("dama %s: exit %d, %s in:\n%q", strings.Join(args, " "), res.Code, what, res.Stdout+res.Stderr)
		}
		if !strings.Contains(res.Stdout, "evil") {
			t.Errorf("dama %s does not show what the command wrote:\n%s", strings.Join(args, " "), res.Stdout)
		}
	}
	for _, args := range [][]string{{"logs", sid}, {"submit", "rogue", "--wait"}, {"status", sid}} {
		out := onTerminal(t, env, cfg, "200 50", 60*time.Second, args...)
		if what := driving(out, true); what != "" || !strings.Contains(out, "evil") && !strings.Contains(out, "end") {
			t.Errorf("dama %s on a terminal: %s in:\n%q", strings.Join(args, " "), what, out)
		}
	}
}
