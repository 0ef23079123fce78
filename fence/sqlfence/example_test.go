package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/lockd/lockd/fence"
	"github.com/lockd/lockd/fence/sqlfence"
)

// A write goes through Do with the holder's credentials (with lockd's Go
// client: sqlfence.CredentialsOf(lock)). A holder that paused and wakes up
// after a newer holder has written is refused by the database, and nothing
// of its transaction is written.
func Example() {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	f, err := sqlfence.New(db, sqlfence.Config{Dialect: sqlfence.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := f.Migrate(ctx); err != nil { // the guard table, once
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE reports (id TEXT PRIMARY KEY, body TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	write := func(token uint64, body string) {
		err := f.Do(ctx, "reports/q3", fence.Credentials{Token: token, Lock: "reports"},
			func(ctx context.Context, tx sqlfence.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO reports (id, body) VALUES ('q3', ?)
					ON CONFLICT (id) DO UPDATE SET body = excluded.body`, body)
				return err
			})
		fmt.Println(token, err)
	}
	write(34, "from the new holder")
	write(33, "from a paused holder") // the old holder wakes up: refused

	var body string
	if err := db.QueryRow(`SELECT body FROM reports WHERE id = 'q3'`).Scan(&body); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored:", body)
	// Output:
	// 34 <nil>
	// 33 fence: stale fencing token 33 for "reports/q3": highest accepted is 34
	// stored: from the new holder
}
