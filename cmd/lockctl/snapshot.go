package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

func (e *env) snapshotCmd() *cobra.Command {
	c := group(&cobra.Command{
		Use:   "snapshot",
		Short: "save and restore backups (admin token)",
	}, "save FILE or restore FILE")
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "write a backup of every lock, waiter, session and the token counter to FILE",
		Long: `Write a backup of every lock, waiter, session and the token counter to
FILE, from the leader (a linearizable read; admin token). It is written to
a temporary file beside FILE (mode 0600: it holds session ids), synced, then
renamed over FILE, so FILE is always either the old file or a whole backup;
prints the bytes written. --timeout bounds the whole transfer.`,
		Args: positional("FILE"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.snapshotSave(c.Context(), args[0]))
		},
	}
	var force bool
	var minToken uint64
	restore := &cobra.Command{
		Use:   "restore FILE [--force] [--min-token N]",
		Short: "load a backup into a fresh cluster (admin token)",
		Long: `Load a backup into a fresh cluster (admin token). A cluster that holds any
state (locks, sessions or issued tokens) is refused unless --force, which
replaces it. Tokens never go down; --min-token N raises the counter to at
least N, so every new token is above N: for a backup older than the last
token issued (pass the highest token in use, e.g. the highest a fencing
resource server accepted). The file is read in place, not into memory;
--timeout bounds the whole transfer.`,
		Args: positional("FILE"),
		RunE: func(c *cobra.Command, args []string) error {
			return status(e.snapshotRestore(c.Context(), args[0], force, minToken))
		},
	}
	restore.Flags().BoolVar(&force, "force", false, "replace the state of a cluster that already holds locks, sessions or tokens")
	restore.Flags().Uint64Var(&minToken, "min-token", 0, "raise the restored token counter to at least `N`: every new token is above N (for a backup older than the last token issued)")
	c.AddCommand(save, restore)
	return c
}

// snapshotSave streams the backup into a temporary file beside path, syncs
// it and renames it over path, so path is either the old file or a whole
// new backup, never a part of one.
func (e *env) snapshotSave(ctx context.Context, path string) int {
	a, err := e.api()
	if err != nil {
		return e.setupFailed(err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s is a directory; name the backup file\n", safe(path))
		return exitError
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*") // mode 0600
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s\n", safe(err.Error()))
		return exitError
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	ctx, cancel := e.ctx(ctx, 0)
	defer cancel()
	n, err := a.SnapshotSave(ctx, tmp)
	if err != nil {
		return e.fail(err, "snapshot save")
	}
	if n == 0 {
		fmt.Fprintln(e.stderr, "lockctl: snapshot save: the leader sent an empty backup")
		return exitError
	}
	if err := tmp.Sync(); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s\n", safe(err.Error()))
		return exitError
	}
	if err := tmp.Close(); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s\n", safe(err.Error()))
		return exitError
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s\n", safe(err.Error()))
		return exitError
	}
	done = true
	syncDir(dir) // make the rename durable
	e.print(map[string]any{"file": path, "bytes": n}, fmt.Sprintf("saved %d bytes to %s", n, path))
	return exitOK
}

// snapshotRestore sends the backup file to the leader. The file is read in
// place for each send (see client.API.SnapshotRestore), not into memory.
// minToken > 0 raises the restored token counter to at least minToken.
func (e *env) snapshotRestore(ctx context.Context, path string, force bool, minToken uint64) int {
	a, err := e.api()
	if err != nil {
		return e.setupFailed(err)
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot restore: %s\n", safe(err.Error()))
		return exitError
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		fmt.Fprintf(e.stderr, "lockctl: snapshot restore: %s is not a backup file (empty, or not a regular file)\n", safe(path))
		return exitError
	}
	ctx, cancel := e.ctx(ctx, 0)
	defer cancel()
	if err := a.SnapshotRestore(ctx, f, force, client.WithMinToken(minToken)); err != nil {
		var se *client.ServerError
		if errors.As(err, &se) && se.API.Code == api.CodeInvalidArgument && strings.HasPrefix(se.API.Message, api.MsgRestoreNotEmpty) {
			fmt.Fprintf(e.stderr, "lockctl: snapshot restore %s: refused: the cluster already holds state (locks, sessions or issued tokens); "+
				"restore into a fresh cluster, or pass --force to replace its state with the backup\n", path)
			return exitError
		}
		return e.fail(err, "snapshot restore "+path)
	}
	text := fmt.Sprintf("restored %s (%d bytes)", path, fi.Size())
	if minToken > 0 {
		text += fmt.Sprintf("; new tokens are above %d", minToken)
	}
	e.print(map[string]any{"restored": true, "file": path, "bytes": fi.Size(), "force": force, "min_token": minToken}, text)
	return exitOK
}
