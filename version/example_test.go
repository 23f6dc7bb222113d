package version_test

import (
	"fmt"
	"strings"

	"github.com/dama-etl/dama/version"
)

// The release is vMAJOR.MINOR.PATCH, with a "-dev" suffix between releases;
// the commit is the build's.
func Example() {
	fmt.Println(strings.HasPrefix(version.Release, "v"), version.Commit() != "")
	// Output: true true
}
