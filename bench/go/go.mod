module example.invalid/ferrolock/bench/go

go 1.26.0

require (
	example.invalid/ferrolock/ffi/go v0.0.0
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/sys v0.48.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
)

replace example.invalid/ferrolock/ffi/go => ../../ffi/go
