// gptoss Go binding: cgo over libgptoss.so, no dependencies (GOFLAGS=-mod=mod GOPROXY=off).
module gptoss

go 1.19
