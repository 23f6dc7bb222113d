package dama

import (
	"context"
	"encoding/json"
	"testing"
)

// A Go program's submission of arguments that are not a JSON object is
// refused in the user's words, and makes no task.
func TestSubmitRefusesArgumentsThatAreNotAnObject(t *testing.T) {
	env, client := newTestClient(t)
	ctx := context.Background()
	for args, want := range map[string]string{
		`42`:     "arguments must be a JSON object, not a number",
		`[1, 2]`: "arguments must be a JSON object, not an array",
		`null`:   "arguments must be a JSON object, not null",
	} {
		if _, _, err := client.Submit(ctx, SubmitParams{Kind: "sample", Args: json.RawMessage(args)}); err == nil || err.Error() != want {
			t.Errorf("args %s: %v, want %q", args, err, want)
		}
	}
	var n int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d tasks made (%v), want none", n, err)
	}
}
