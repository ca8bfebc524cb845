package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	ferrolock "example.invalid/ferrolock/ffi/go"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

const ttl = 10 * time.Second

// compareDel is the release every hand-written Redis lock uses (and redsync's, but for its
// -1 on a missing key).
const compareDel = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`

// Names as in the tables; baseline is what every uncontended ratio is against.
const (
	baseline      = "hand-written go-redis"
	redsyncName   = "redsync"
	ferroAcquire  = "ferrolock Acquire/Release"
	ferroWithLock = "ferrolock WithLock"
)

type lib struct {
	name string
	op   func(ctx context.Context) error
}

func newClients(all []*server) ([]*redis.Client, error) {
	var cs []*redis.Client
	for _, s := range all {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
		if err := c.Ping(context.Background()).Err(); err != nil {
			return nil, fmt.Errorf("ping %s: %w", s.Addr, err)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// onEvery runs f on every client at once (inline with one) and counts the true answers.
func onEvery(cs []*redis.Client, f func(*redis.Client) bool) int {
	if len(cs) == 1 {
		if f(cs[0]) {
			return 1
		}
		return 0
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for _, c := range cs {
		wg.Add(1)
		go func(c *redis.Client) {
			defer wg.Done()
			if f(c) {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	return n
}

// ferrolockManager is a Go ferrolock manager on these servers. The restart guard is off: the
// servers are fresh, and the guard would hold back their votes for the first ttl.
func ferrolockManager(nodes []string) (*ferrolock.Manager, error) {
	return ferrolock.NewManager(ferrolock.Nodes(nodes...), ferrolock.TTL(ttl),
		ferrolock.Set("restart_guard", time.Duration(0)))
}

// libraries builds every uncontended contender on the same servers; close frees them.
func libraries(all []*server) ([]lib, func(), error) {
	cs, err := newClients(all)
	if err != nil {
		return nil, nil, err
	}
	quorum := len(cs)/2 + 1
	script := redis.NewScript(compareDel)
	var pools []redsyncredis.Pool
	for _, c := range cs {
		pools = append(pools, goredis.NewPool(c))
	}
	rs := redsync.New(pools...)
	mutex := rs.NewMutex("bench:redsync", redsync.WithExpiry(ttl), redsync.WithTries(1))
	m, err := ferrolockManager(urls(all))
	if err != nil {
		return nil, nil, err
	}
	n := 0
	pid := os.Getpid()
	libs := []lib{
		{baseline, func(ctx context.Context) error {
			n++
			token := fmt.Sprintf("%d:%d", pid, n)
			got := onEvery(cs, func(c *redis.Client) bool {
				ok, err := c.SetNX(ctx, "bench:go-redis", token, ttl).Result()
				return err == nil && ok
			})
			if got < quorum {
				return fmt.Errorf("go-redis: not acquired (%d of %d)", got, len(cs))
			}
			onEvery(cs, func(c *redis.Client) bool {
				return script.Run(ctx, c, []string{"bench:go-redis"}, token).Err() == nil
			})
			return nil
		}},
		{redsyncName, func(ctx context.Context) error {
			if err := mutex.LockContext(ctx); err != nil {
				return fmt.Errorf("redsync: %w", err)
			}
			_, err := mutex.UnlockContext(ctx)
			return err
		}},
		{ferroAcquire, func(ctx context.Context) error {
			l, err := m.Acquire(ctx, "bench:ferrolock")
			if err != nil {
				return err
			}
			return l.Release()
		}},
		{ferroWithLock, func(ctx context.Context) error {
			return m.WithLock(ctx, "bench:withlock", func(context.Context, *ferrolock.Lock) error { return nil })
		}},
	}
	floor, closeFloor, err := cgoBlockingLib(urls(all))
	if err != nil {
		return nil, nil, err
	}
	libs = append(libs, floor)
	closeAll := func() {
		closeFloor()
		m.Close()
		for _, c := range cs {
			c.Close()
		}
	}
	return libs, closeAll, nil
}
