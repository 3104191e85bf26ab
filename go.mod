module github.com/gccl/gccl

go 1.26
