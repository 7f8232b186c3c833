// Package extmcppb holds the Go types and gRPC stubs of agentgateway's
// ExtMcp protocol (agentgateway.dev.ext_mcp.ExtMcp: CheckRequest and
// CheckResponse), generated from ext_mcp.proto in this folder, a copy of
// crates/protos/proto/ext_mcp.proto of github.com/agentgateway/agentgateway
// at commit 75b4e6ce6e0e1ac7959d5548ebe8dbeaede4f180 (2026-08-21).
// agentgateway publishes its own stubs in the module
// github.com/agentgateway/agentgateway/api, which the Go module proxy does
// not serve here, so they are generated, never edited by hand.
//
// Generated with protoc 3.21.12 (Debian's protobuf-compiler),
// protoc-gen-go v1.36.12 and protoc-gen-go-grpc v1.6.2, in this folder:
//
//	M='Mext_mcp.proto=github.com/countersign/countersign/agent/extauthz/extmcp/extmcppb;extmcppb'
//	protoc -I. --go_out=. --go_opt=paths=source_relative --go_opt="$M" \
//	  --go-grpc_out=. --go-grpc_opt=paths=source_relative --go-grpc_opt="$M" ext_mcp.proto
package extmcppb
