package dama

import (
	"testing"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
)

// newTestClient returns a database for t and a Client of two command
// kinds over it.
func newTestClient(t *testing.T) (*testenv.Env, *Client) {
	t.Helper()
	env := testenv.New(t)
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
queues:
  etl: { max_running: 10 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  other: { queue: etl, command: ["{{sample}}"] }
`))
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env, client
}
