package damacli

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
)

func newSubmitCommand(g *globals) *cobra.Command {
	var (
		wait   bool
		args   string
		key    string
		parent int64
		delay  time.Duration
		runAt  string
	)
	cmd := &cobra.Command{
		Use:               "submit KIND",
		ValidArgsFunction: g.complete((*config.Config).KindNames),
		Short:             "Submit a task; prints its id",
		Long: `Submit a task of a configured kind and print its id (etl_context_id) alone on
stdout. With --idempotency-key, submitting the same key again with the same
kind prints the id of the first submission and creates nothing; with
another kind it is an error. Keys starting with "dama:" are dama's own and
refused.`,
		RunE: func(cmd *cobra.Command, argv []string) error {
			cfg, err := config.Load(g.configPath)
			switch {
			case len(argv) != 1 && err == nil:
				return fmt.Errorf("name one kind to submit: %s (dama submit KIND [--args '{...}'])", strings.Join(cfg.KindNames(), ", "))
			case len(argv) != 1:
				return fmt.Errorf("name one kind to submit (dama submit KIND [--args '{...}']); and no kinds to list: %w", err)
			case err != nil:
				return err
			}
			if _, ok := cfg.Kind(argv[0]); !ok {
				return fmt.Errorf("unknown kind %q: the configuration has %s", argv[0], strings.Join(cfg.KindNames(), ", "))
			}
			if err := jsonObject(args); err != nil {
				return fmt.Errorf("--args: want a JSON object, as '{\"region\": \"eu\"}'; %w", err)
			}
			if _, err := dueAt(runAt, delay, time.Now()); err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			// --delay counts from the submission, not from before a
			// connection that may have taken seconds; checked above.
			due, _ := dueAt(runAt, delay, time.Now())
			client, err := dama.NewClient(pool, cfg)
			if err != nil {
				return err
			}
			p := dama.SubmitParams{Kind: argv[0], Args: json.RawMessage(args), IdempotencyKey: key, ParentID: parent, ScheduledAt: due}
			id, _, err := client.Submit(cmd.Context(), p)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			if !wait {
				return nil
			}
			g.code, err = waitForTask(cmd.Context(), client, pool, id, cmd.ErrOrStderr())
			return err
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the task to finish, showing its progress on stderr; exit 0 only when it is DONE (20 FAILED, 21 CANCELLED, 22 wait ended first)")
	cmd.Flags().StringVar(&args, "args", "{}", "the task's arguments, a JSON object")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "submit at most once for this key")
	cmd.Flags().Int64Var(&parent, "parent", 0, "the id of the parent task")
	cmd.Flags().DurationVar(&delay, "delay", 0, "start no earlier than this long from now")
	cmd.Flags().StringVar(&runAt, "run-at", "", "start no earlier than this time (RFC 3339, e.g. 2026-11-22T18:00:00+01:00)")
	return cmd
}

// dueAt is when a task submitted at now with --run-at and --delay may
// start; zero means at once.
func dueAt(runAt string, delay time.Duration, now time.Time) (time.Time, error) {
	switch {
	case delay < 0:
		return time.Time{}, errors.New("--delay must not be negative")
	case runAt != "" && delay > 0:
		return time.Time{}, errors.New("--run-at and --delay exclude each other")
	case runAt != "":
		t, err := parseRFC3339(runAt)
		if err != nil {
			return time.Time{}, fmt.Errorf("--run-at %q: want an RFC 3339 time such as 2026-11-22T18:00:00Z", runAt)
		}
		return t, nil
	case delay > 0:
		return now.Add(delay), nil
	}
	return time.Time{}, nil
}

// rfc3339 is RFC 3339's date-time grammar, whose T and Z may be lower
// case. time.Parse alone refuses those, and takes a one-digit hour, a
// comma before the fraction and offsets such as +24:60, which RFC 3339
// cannot write back.
var rfc3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// parseRFC3339 reads s as an RFC 3339 date-time; time.Parse checks the
// ranges of the date and the time of day (a leap second is refused).
func parseRFC3339(s string) (time.Time, error) {
	if !rfc3339.MatchString(s) {
		return time.Time{}, errors.New("not an RFC 3339 date-time")
	}
	return time.Parse(time.RFC3339, strings.ToUpper(s))
}

// jsonObject says what args is if not a JSON object, without quoting it:
// arguments may hold credentials, which an error must not print.
func jsonObject(args string) error {
	var v any
	dec := json.NewDecoder(strings.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return fmt.Errorf("not JSON at byte %d", syntax.Offset)
		}
		return errors.New("not JSON")
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	switch v.(type) {
	case map[string]any:
		return nil
	case []any:
		return errors.New("got an array")
	case nil:
		return errors.New("got null")
	case string:
		return errors.New("got a string")
	case json.Number:
		return errors.New("got a number")
	case bool:
		return errors.New("got a boolean")
	}
	return errors.New("got another JSON value")
}

// quoteArg quotes a command-line argument for an error message, cut short.
func quoteArg(s string) string {
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return strconv.Quote(s)
}
