package main

import (
	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/agent"
)

// newAgentCmd is vigil agent: the same command as the vigil-agent binary.
func newAgentCmd() *cobra.Command { return agent.Command("agent") }
