// pgxpool at its defaults (each pooled connection in QueryExecModeCacheStatement, its own
// cache of named prepared statements) through Weir in transaction mode: 20 goroutines
// share a pool of 10 connections, which share Weir's few servers.
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
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	poolWorkers = 20
	poolConns   = 10
)

// Runs f in poolWorkers goroutines at once; returns every error, by worker.
func eachWorker(f func(w int) error) []error {
	var wg sync.WaitGroup
	errs := make([]error, poolWorkers)
	for w := 0; w < poolWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					errs[w] = fmt.Errorf("%v", r)
				}
			}()
			errs[w] = f(w)
		}(w)
	}
	wg.Wait()
	var failed []error
	for w, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("worker %d: %w", w, err))
		}
	}
	return failed
}

func poolWorker(ctx context.Context, pool *pgxpool.Pool, w int) error {
	for n := 0; n < 10; n++ {
		var p int
		var tag string
		err := pool.QueryRow(ctx, "select $1::int * $2::int, $3::text || '-' || $2::text", n, w, "w").Scan(&p, &tag)
		if err != nil {
			return err
		}
		check(p == n*w && tag == "w-"+strconv.Itoa(w), "%d*%d = %d, %q", n, w, p, tag)
		if _, err := pool.Exec(ctx, "insert into drv_pgx (id, v) values ($1, $2)", w*1000+n, "q"+strconv.Itoa(n)); err != nil {
			return err
		}
	}
	// A transaction rolled back: its insert is seen inside it, then nowhere.
	lost := 500000 + w
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "insert into drv_pgx (id, v) values ($1, $2)", lost, "lost"); err != nil {
		return err
	}
	var count int
	if err := tx.QueryRow(ctx, "select count(*) from drv_pgx where id = $1", lost).Scan(&count); err != nil {
		return err
	}
	check(count == 1, "the transaction does not see its own insert")
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, "select count(*) from drv_pgx where id = $1", lost).Scan(&count); err != nil {
		return err
	}
	check(count == 0, "the rolled-back insert is visible")
	// A transaction committed at another isolation level, with an error it recovers from
	// by a savepoint.
	tx, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "insert into drv_pgx (id, v) values ($1, $2)", w*1000+10, "tx"); err != nil {
		return err
	}
	var iso string
	if err := tx.QueryRow(ctx, "select current_setting($1)", "transaction_isolation").Scan(&iso); err != nil {
		return err
	}
	check(iso == "repeatable read", "isolation %q", iso)
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = sp.Exec(ctx, "insert into drv_pgx (id, v) values ($1, $2)", w*1000+10, "duplicate")
	var pgErr *pgconn.PgError
	check(errors.As(err, &pgErr) && pgErr.Code == "23505", "the duplicate key was not refused: %v", err)
	if err := sp.Rollback(ctx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	// COPY, and a batch of inserts with a query at its end, each on one pooled connection.
	if err := copyRows(ctx, pool, w*1000, 100, 150); err != nil {
		return err
	}
	batch := &pgx.Batch{}
	for k := 200; k < 220; k++ {
		batch.Queue("insert into drv_pgx (id, v) values ($1, $2)", w*1000+k, "b"+strconv.Itoa(k))
	}
	batch.Queue("select count(*) from drv_pgx where id / 1000 = $1", w)
	br := pool.SendBatch(ctx, batch)
	for k := 200; k < 220; k++ {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
	}
	if err := br.QueryRow().Scan(&count); err != nil {
		br.Close()
		return err
	}
	if err := br.Close(); err != nil {
		return err
	}
	check(count == 10+1+50+20, "%d rows after the batch", count)
	// The statement the DDL will change, in the statement cache of the connections.
	for n := 0; n < 3; n++ {
		var v int
		if err := pool.QueryRow(ctx, "select v from drv_pgx_ddl where id = $1", w).Scan(&v); err != nil {
			return err
		}
		check(v == w*10, "drv_pgx_ddl %d: %d", w, v)
	}
	return nil
}

// After the column's type changed, a cached statement's old plan is refused once per
// server that holds it ("cached plan must not change result type", 0A000; pgx then drops
// the statement from its cache and prepares it again). Returns how many refusals this
// worker met.
func afterDDL(ctx context.Context, pool *pgxpool.Pool, w int) (int, error) {
	refused := 0
	for n := 0; n < 3; n++ {
		var v string
		err := pool.QueryRow(ctx, "select v from drv_pgx_ddl where id = $1", w).Scan(&v)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "0A000" && refused < poolConns {
			refused++
			n--
			continue
		}
		if err != nil {
			return refused, err
		}
		check(v == "t"+strconv.Itoa(w*10), "drv_pgx_ddl %d after the DDL: %q", w, v)
	}
	return refused, nil
}

func poolMain() {
	ctx := context.Background()
	url := fmt.Sprintf("postgres://%s@%s:%s/%s?application_name=drv-pgx-pool&sslmode=disable&pool_max_conns=%d",
		os.Getenv("WEIR_USER"), os.Getenv("WEIR_HOST"), os.Getenv("WEIR_PORT"), os.Getenv("WEIR_DB"), poolConns)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		panic(err)
	}
	check(cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement,
		"default query exec mode %v", cfg.ConnConfig.DefaultQueryExecMode)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	fail := func(stage string, errs []error) {
		if len(errs) == 0 {
			return
		}
		for _, err := range errs {
			fmt.Printf("%s: %v\n", stage, err)
		}
		fmt.Fprintf(os.Stderr, "%d worker(s) failed %s\n", len(errs), stage)
		os.Exit(1)
	}
	fail("before the DDL", eachWorker(func(w int) error { return poolWorker(ctx, pool, w) }))
	if _, err := pool.Exec(ctx, "alter table drv_pgx_ddl alter column v type text using 't' || v"); err != nil {
		panic(err)
	}
	var mu sync.Mutex
	refusals := 0
	fail("after the DDL", eachWorker(func(w int) error {
		r, err := afterDDL(ctx, pool, w)
		mu.Lock()
		refusals += r
		mu.Unlock()
		return err
	}))
	// Once per pooled connection at most, as on a direct connection: a statement prepared
	// again after the refusal is a fresh one on every server.
	check(refusals <= poolConns, "%d refusals of a stale plan on %d connections", refusals, poolConns)
	stat := pool.Stat()
	fmt.Printf("pgxpool: %d workers ok on %d connections, %d refusals of a stale plan after the DDL\n",
		poolWorkers, stat.TotalConns(), refusals)
}
