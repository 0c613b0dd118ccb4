// Command vigil keeps a Kubernetes control plane reachable: `vigil run` on
// each control-plane node elects one holder of the virtual IP over etcd.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vigil:", config.FlagNames(err.Error(), root))
		stop()
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "vigil",
		Short:         "Keep a Kubernetes control plane reachable through one virtual IP",
		Version:       vigil.BuildInfo().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.AddCommand(newRunCmd(), newAgentCmd(), newMembersCmd(), newManifestCmd(), newStatusCmd(), newVersionCmd(), newGuardCmd(), newConfigCmd(), newHandoffCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the revision it was built from and the Go release (as --version does)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "vigil", vigil.BuildInfo())
			return nil
		},
	}
}
