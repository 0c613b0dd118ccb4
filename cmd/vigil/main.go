// Command vigil keeps a Kubernetes control plane reachable: `vigil run` on
// each control-plane node elects one holder of the virtual IP over etcd.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil"
)

// version, when set with -ldflags "-X main.version=...", overrides the
// VERSION file's (vigil.Version).
var version string

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vigil:", err)
		stop()
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "vigil",
		Short:         "Keep a Kubernetes control plane reachable through one virtual IP",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newAgentCmd(), newMembersCmd(), newManifestCmd(), newStatusCmd(), newVersionCmd(), newGuardCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if v == "" {
				v = vigil.Version
			}
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						v += "+" + s.Value
					}
				}
				v += " " + bi.GoVersion
			}
			fmt.Fprintln(cmd.OutOrStdout(), "vigil", v)
			return nil
		},
	}
}
