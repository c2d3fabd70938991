// pgx v5 at its default settings (QueryExecModeCacheStatement: a statement cache of
// named prepared statements per connection) through Weir in transaction mode: one
// pgx.Conn per client, or with the argument "pool" a pgxpool (pool.go).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func check(cond bool, format string, args ...any) {
	if !cond {
		panic(fmt.Sprintf("FAILED: "+format, args...))
	}
}

// A pgx.Conn or a pgxpool.Pool.
type copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Copies rows base+from to base+to-1 into drv_pgx, each with v "c<k>".
func copyRows(ctx context.Context, c copier, base, from, to int) error {
	rows := make([][]any, 0, to-from)
	for k := from; k < to; k++ {
		rows = append(rows, []any{base + k, "c" + strconv.Itoa(k)})
	}
	copied, err := c.CopyFrom(ctx, pgx.Identifier{"drv_pgx"}, []string{"id", "v"}, pgx.CopyFromRows(rows))
	if err != nil {
		return err
	}
	check(copied == int64(to-from), "copied %d rows of %d", copied, to-from)
	return nil
}

func client(ctx context.Context, i int, meet *sync.WaitGroup) (err error) {
	met := false
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		// A client that failed early must not leave the others waiting for it.
		if !met {
			meet.Done()
		}
	}()
	app := fmt.Sprintf("drv-pgx-%d", i)
	url := fmt.Sprintf("postgres://%s@%s:%s/%s?application_name=%s&sslmode=disable",
		os.Getenv("WEIR_USER"), os.Getenv("WEIR_HOST"), os.Getenv("WEIR_PORT"), os.Getenv("WEIR_DB"), app)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for n := 0; n < 8; n++ {
		var s int
		var a string
		if err := conn.QueryRow(ctx, "select $1::int + $2::int, current_setting('application_name')", n, i).Scan(&s, &a); err != nil {
			return err
		}
		check(s == n+i, "client %d: %d != %d", i, s, n+i)
		check(a == app, "client %d: application_name %q != %q", i, a, app)
		if n == 3 {
			met = true
			meet.Done()
			meet.Wait()
		}
	}
	// A transaction with an error mid-way, then the connection still works.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "insert into drv_pgx (id, v) values ($1, 'lost')", 100000+i); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "select 1 / ($1::int - $1::int)", i)
	var pgErr *pgconn.PgError
	check(errors.As(err, &pgErr) && pgErr.Code == "22012", "client %d: division by zero was not raised: %v", i, err)
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	var count int
	if err := conn.QueryRow(ctx, "select count(*) from drv_pgx where id = $1", 100000+i).Scan(&count); err != nil {
		return err
	}
	check(count == 0, "client %d: the failed transaction's insert is visible", i)
	// A batch and COPY.
	batch := &pgx.Batch{}
	for k := 0; k < 20; k++ {
		batch.Queue("insert into drv_pgx (id, v) values ($1, $2)", i*1000+k, "b"+strconv.Itoa(k))
	}
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	if err := copyRows(ctx, conn, i*1000, 100, 200); err != nil {
		return err
	}
	for n := 0; n < 6; n++ {
		if err := conn.QueryRow(ctx, "select count(*) from drv_pgx where id / 1000 = $1", i).Scan(&count); err != nil {
			return err
		}
		check(count == 120, "client %d: %d rows", i, count)
	}
	// Session state (SET search_path) follows the client in transaction mode, and
	// no other client on the same server sees it.
	if _, err = conn.Exec(ctx, fmt.Sprintf("set search_path to drv_schema_%d, public", i)); err != nil {
		return err
	}
	var sp string
	if err = conn.QueryRow(ctx, "show search_path").Scan(&sp); err != nil {
		return err
	}
	check(sp == fmt.Sprintf("drv_schema_%d, public", i), "search_path %q", sp)
	return nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pool" {
		poolMain()
		return
	}
	clients, _ := strconv.Atoi(os.Getenv("WEIR_CLIENTS"))
	if clients == 0 {
		clients = 10
	}
	ctx := context.Background()
	var meet, done sync.WaitGroup
	meet.Add(clients)
	errs := make([]error, clients)
	for i := 0; i < clients; i++ {
		done.Add(1)
		go func(i int) {
			defer done.Done()
			errs[i] = client(ctx, i, &meet)
		}(i)
	}
	done.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			fmt.Printf("client %d: %v\n", i, err)
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "%d client(s) failed\n", failed)
		os.Exit(1)
	}
	fmt.Printf("pgx v5: %d clients ok\n", clients)
}
