package main

import (
	"errors"

	"github.com/spf13/pflag"
)

// errHelp: -h or --help was given to a command that parses its own flags
// (run); its help is printed, exit 0.
var errHelp = errors.New("help requested")

// parseArgs parses flags interleaved with positional arguments and stops
// where run's own arguments end: "run NAME --wait 5s -- CMD" and
// "run NAME --wait=5s CMD -x" must both work, and CMD's flags are CMD's.
// It stops at "--" (rest is what follows) or, with maxPos > 0, at the
// maxPos-th positional argument (rest is what follows it, not parsed).
func parseArgs(fs *pflag.FlagSet, args []string, maxPos int) (pos, rest []string, err error) {
	fs.SetInterspersed(false)
	for {
		before := args
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, pflag.ErrHelp) {
				return nil, nil, errHelp
			}
			return nil, nil, err
		}
		if h, _ := fs.GetBool("help"); h {
			return nil, nil, errHelp
		}
		args = fs.Args()
		if n := len(before) - len(args); n > 0 && before[n-1] == "--" {
			return pos, args, nil
		}
		if len(args) == 0 {
			return pos, nil, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
		if maxPos > 0 && len(pos) == maxPos {
			return pos, args, nil
		}
	}
}
