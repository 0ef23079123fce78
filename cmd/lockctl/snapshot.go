package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/client"
)

func (e *env) snapshot(ctx context.Context, args []string) int {
	if len(args) == 0 {
		return usageErr(e.stderr, fmt.Errorf("snapshot: want save FILE or restore FILE"))
	}
	switch sub, args := args[0], args[1:]; sub {
	case "save":
		fs := e.command("snapshot save", "snapshot save FILE")
		pos, code, ok := e.parse(fs, args, "FILE")
		if !ok {
			return code
		}
		return e.snapshotSave(ctx, pos[0])
	case "restore":
		fs := e.command("snapshot restore", "snapshot restore FILE [--force] [--min-token N]")
		force := fs.Bool("force", false, "replace the state of a cluster that already holds locks, sessions or tokens")
		minToken := fs.Uint64("min-token", 0, "raise the restored token counter to at least N: every new token is above N (for a backup older than the last token issued)")
		pos, code, ok := e.parse(fs, args, "FILE")
		if !ok {
			return code
		}
		return e.snapshotRestore(ctx, pos[0], *force, *minToken)
	default:
		return usageErr(e.stderr, fmt.Errorf("snapshot: unknown subcommand %q (want save or restore)", sub))
	}
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
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %s is a directory; name the backup file\n", path)
		return exitError
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*") // mode 0600
	if err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %v\n", err)
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
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %v\n", err)
		return exitError
	}
	if err := tmp.Close(); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %v\n", err)
		return exitError
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		fmt.Fprintf(e.stderr, "lockctl: snapshot save: %v\n", err)
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
		fmt.Fprintf(e.stderr, "lockctl: snapshot restore: %v\n", err)
		return exitError
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		fmt.Fprintf(e.stderr, "lockctl: snapshot restore: %s is not a backup file (empty, or not a regular file)\n", path)
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
