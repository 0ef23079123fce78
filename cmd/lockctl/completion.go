package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// completionCmd writes a shell completion script (cobra's), with the way
// to install it in its help.
func completionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "print a shell completion script: commands, flags, member ids",
		Long: `Print the completion script for a shell on stdout. It completes commands,
flags, -o's formats and the member ids of cluster remove and --to (asked of
the cluster named by --endpoints or LOCKD_ENDPOINTS, within 2 seconds).

  bash:  source <(lockctl completion bash)     # in ~/.bashrc; needs bash-completion
         lockctl completion bash > /etc/bash_completion.d/lockctl
  zsh:   lockctl completion zsh > "${fpath[1]}/_lockctl"   # compinit must be on
  fish:  lockctl completion fish > ~/.config/fish/completions/lockctl.fish
  powershell:  lockctl completion powershell | Out-String | Invoke-Expression`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args: func(c *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return fmt.Errorf("completion: missing the shell (bash, zsh, fish or powershell)")
			case len(args) > 1:
				return fmt.Errorf("completion: unexpected argument %q", args[1])
			}
			return cobra.OnlyValidArgs(c, args)
		},
		RunE: func(c *cobra.Command, args []string) error {
			root, out := c.Root(), c.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			default:
				return root.GenPowerShellCompletionWithDesc(out)
			}
		},
	}
}
