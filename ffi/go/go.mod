module example.invalid/ferrolock/ffi/go

go 1.22
