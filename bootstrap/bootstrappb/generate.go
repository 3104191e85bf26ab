// Package bootstrappb holds the generated gRPC and protobuf code of gccl's
// rendezvous protocol (bootstrap.proto). The generated files are committed so
// that building gccl needs no protoc.
//
// To regenerate after editing bootstrap.proto (versions must match go.mod):
//
//	apt-get install -y protobuf-compiler   # libprotoc 3.21.12 was used
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.10
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
//	go generate ./bootstrap/bootstrappb/
package bootstrappb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative bootstrap.proto
