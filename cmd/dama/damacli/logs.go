package damacli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/logdir"
)

func newLogsCommand() *cobra.Command {
	var follow, raw bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print the log of a task, from any host",
		Long: `Print the log of a task: the task process's own lines and its command's
output. On the host the task ran on, the whole log file; on any other host,
or once the file is gone, the tail of each attempt's output that the
database keeps (log_tail_bytes of the configuration, 1 MiB by default),
with a line on stderr where output was not kept. With --follow, keep
printing what comes until the task is finished. On a terminal, control
characters a command wrote (escape sequences) are shown as ^[ and the like
rather than acted on, unless --raw.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			id, err := parseID(argv[0])
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(ctx, 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			c, err := etlcontext.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			for follow && c.LogPath == nil && !c.Status.Finished() {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				if c, err = etlcontext.Get(ctx, pool, id); err != nil {
					return err
				}
			}
			if c.LogPath == nil {
				return fmt.Errorf("task %d has no log (it is %s and never started)", id, c.Status)
			}
			out := cmd.OutOrStdout()
			if _, _, tty := terminalSize(out); tty && !raw {
				shown := &controlShown{w: out}
				defer shown.Close()
				out = shown
			}
			f, err := openLocalLog(c)
			if err != nil {
				printed, kerr := printKeptLog(ctx, pool, id, out, cmd.ErrOrStderr(), follow, err)
				if kerr == nil && !printed {
					kerr = fmt.Errorf("%s, and the database keeps none of its output", shownText(err.Error()))
				}
				return kerr
			}
			defer f.Close()
			if _, err := io.Copy(out, f); err != nil || !follow {
				return err
			}
			return followLog(ctx, pool, id, f, out)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the task is finished")
	cmd.Flags().BoolVar(&raw, "raw", false, "on a terminal too, print the log's bytes as they are, escape sequences included")
	return cmd
}

// controlShown writes what is written to it with the characters a
// terminal would act on shown instead: C0 but tab, newline and carriage
// return, and DEL, in caret notation (ESC as ^[); C1 controls, format
// characters (a bidi override reverses what follows it, a zero-width one
// hides) and bytes that are not UTF-8, as U+FFFD. A log is anyone's
// command's output: on an operator's terminal, an escape sequence could
// set its title, write its clipboard or make it answer as if typed.
type controlShown struct {
	w io.Writer
	// carry is the start of a character the last write cut.
	carry []byte
}

func (c *controlShown) Write(p []byte) (int, error) {
	in := append(c.carry, p...)
	out := make([]byte, 0, len(in)+8)
	i := 0
	for i < len(in) {
		if b := in[i]; b < utf8.RuneSelf {
			switch {
			case b < 0x20 && b != '\t' && b != '\n' && b != '\r':
				out = append(out, '^', b+0x40)
			case b == 0x7f:
				out = append(out, '^', '?')
			default:
				out = append(out, b)
			}
			i++
			continue
		}
		if !utf8.FullRune(in[i:]) {
			break
		}
		r, size := utf8.DecodeRune(in[i:])
		if r == utf8.RuneError || moves(r) {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, in[i:i+size]...)
		}
		i += size
	}
	c.carry = append([]byte(nil), in[i:]...)
	if _, err := c.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close shows a character the last write cut, which will not be finished.
func (c *controlShown) Close() error {
	if len(c.carry) == 0 {
		return nil
	}
	c.carry = nil
	_, err := io.WriteString(c.w, "\uFFFD")
	return err
}

// moves reports whether a terminal acts on r, or shows what follows it
// elsewhere than where it is: a C1 control or a format character.
func moves(r rune) bool {
	return r >= 0x80 && r <= 0x9f || r > 0x9f && unicode.Is(unicode.Cf, r)
}

// jsonShown writes JSON with the characters that moves reports escaped
// (\u202e), which encoding/json leaves raw. A json.Encoder writes each
// value whole.
type jsonShown struct{ w io.Writer }

func (j jsonShown) Write(p []byte) (int, error) {
	out := make([]byte, 0, len(p))
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			// A byte that is not UTF-8 (a database of another encoding).
			out = append(out, `\ufffd`...)
		case !moves(r):
			out = append(out, p[i:i+size]...)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	if _, err := j.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// printJSON prints v as indented JSON, written by jsonShown.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(jsonShown{w})
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// openLocalLog opens the log file of c when it is on this host, the one
// that ran its latest attempt (by its identity, or its name after a reboot).
func openLocalLog(c *etlcontext.Context) (*os.File, error) {
	id, _ := hostproc.ID()
	name, _ := os.Hostname()
	if (c.HostID == nil || *c.HostID != id) && (c.Host == nil || *c.Host != name) {
		return nil, fmt.Errorf("the log of task %d is on host %s", c.ID, orDash(c.Host))
	}
	return logdir.OpenLog(*c.LogPath, c.ID)
}

// shownText is s on one line with its control characters shown
// (controlShown): what a task recorded, said on dama's own lines.
func shownText(s string) string {
	var b strings.Builder
	c := controlShown{w: &b}
	_, _ = c.Write([]byte(strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)))
	_ = c.Close()
	return b.String()
}

// followLog copies what is appended to f, to which later attempts append,
// until the context is finished and its log drained, or ctx ends.
func followLog(ctx context.Context, pool *pgxpool.Pool, id int64, f *os.File, out io.Writer) error {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		c, err := etlcontext.Get(ctx, pool, id)
		finished := err == nil && c.Status.Finished()
		n, err := io.Copy(out, f)
		if err != nil {
			return err
		}
		if finished && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// keptLogPoll is how often --follow reads the tail the database keeps,
// which task processes write every log_tail_interval (5s by default).
const keptLogPoll = time.Second

// printKeptLog prints the output of context id that the database keeps,
// attempt by attempt, saying on errOut first why, then where output was
// not kept, and reports whether it printed anything. With follow, it goes
// on until the context is finished and its tail read.
func printKeptLog(ctx context.Context, pool *pgxpool.Pool, id int64, out, errOut io.Writer, follow bool, why error) (printed bool, err error) {
	var pos etlcontext.LogPos
	for {
		// Read before the pieces: a context finished before them has
		// written its last.
		c, err := etlcontext.Get(ctx, pool, id)
		if err != nil {
			return printed, err
		}
		for {
			pieces, err := etlcontext.LogSince(ctx, pool, id, pos, 1<<20)
			if err != nil {
				return printed, err
			}
			if len(pieces) == 0 {
				break
			}
			for _, p := range pieces {
				if !printed {
					fmt.Fprintf(errOut, "dama: %s: printing the output the database keeps\n", shownText(why.Error()))
				}
				switch {
				case p.Attempt != pos.Attempt && p.Offset > 0:
					fmt.Fprintf(errOut, "dama: attempt %d: its first %d bytes are not kept\n", p.Attempt, p.Offset)
				case p.Attempt == pos.Attempt && p.Offset > pos.Offset:
					fmt.Fprintf(errOut, "dama: attempt %d: %d bytes are not kept\n", p.Attempt, p.Offset-pos.Offset)
				}
				if _, err := out.Write(p.Data); err != nil {
					return printed, err
				}
				pos, printed = p.End(), true
			}
		}
		if !follow || c.Status.Finished() {
			return printed, nil
		}
		select {
		case <-ctx.Done():
			return printed, nil
		case <-time.After(keptLogPoll):
		}
	}
}
