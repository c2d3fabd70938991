// Reads a Grafana dashboard's JSON with the types Grafana's own Foundation SDK generates
// from Grafana's dashboard schema, strictly: an unknown or misspelt field, a required
// field missing, a value of the wrong type, a panel's options or field config that its
// panel plugin's schema does not have, all fail. tests/grafana_dashboard.rs runs it on
// deploy/grafana/weir.json. (Grafana itself is AGPL and not fetched here; its schema, in
// the Apache-licensed SDK, is what import checks a dashboard against.)
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: grafana-check dashboard.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The panel plugins' schemas (timeseries, stat, table, ...), for their options.
	plugins.RegisterDefaultPlugins()
	// Fields only an exported dashboard carries, which import reads and does not store.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		fmt.Fprintln(os.Stderr, "not JSON:", err)
		os.Exit(1)
	}
	for _, export := range []string{"__inputs", "__requires", "__elements"} {
		delete(top, export)
	}
	stored, err := json.Marshal(top)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var d dashboard.Dashboard
	// The SDK returns its error list as an error even when the list is empty.
	if errs := d.UnmarshalJSONStrict(stored); errs != nil && errs.Error() != "" {
		fmt.Fprintln(os.Stderr, "not a dashboard of Grafana's schema:", errs)
		os.Exit(1)
	}
	if errs := d.Validate(); errs != nil && errs.Error() != "" {
		fmt.Fprintln(os.Stderr, "invalid:", errs)
		os.Exit(1)
	}
	// Counted from the JSON: the SDK leaves a panel out of d.Panels when its strict
	// reading returns its (empty) error list.
	var shape struct {
		Panels []struct {
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(stored, &shape); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	panels := 0
	for _, p := range shape.Panels {
		panels += 1 + len(p.Panels)
	}
	fmt.Printf("ok: %q, schemaVersion %d, %d panels\n", *d.Title, d.SchemaVersion, panels)
}
