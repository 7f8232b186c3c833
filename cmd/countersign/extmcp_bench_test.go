package main_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/countersign/countersign/agent/extauthz/extmcp/extmcppb"
)

// floorExtMcp answers every CheckRequest pass without looking: the floor
// an ExtMcp processor's latency is measured against.
type floorExtMcp struct{ pb.UnimplementedExtMcpServer }

func (floorExtMcp) CheckRequest(context.Context, *pb.McpRequest) (*pb.McpRequestResult, error) {
	return &pb.McpRequestResult{Result: &pb.McpRequestResult_Pass{Pass: &pb.Pass{}}}, nil
}

// BenchmarkExtMcpAutoAllowed: one CheckRequest after another from a gRPC
// client, of a tools/call the policy lets through (review never: asked of
// the /v1 API, audited, no card), beside the floor. Reports p50 and p99
// per check.
func BenchmarkExtMcpAutoAllowed(b *testing.B) {
	req := agwRequest("tools/call", callParams("lookup", `{"q":"1234"}`), agwHeaders, nil)
	run := func(b *testing.B, c pb.ExtMcpClient) {
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			res, err := c.CheckRequest(ctx, req)
			lat = append(lat, time.Since(start))
			if err != nil || res.GetPass() == nil {
				b.Fatalf("CheckRequest = %v, %v; want pass", res, err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.Run("floor", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		g := grpc.NewServer()
		pb.RegisterExtMcpServer(g, floorExtMcp{})
		go func() { _ = g.Serve(ln) }() // exits when Stop closes ln
		b.Cleanup(g.Stop)
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cc.Close() })
		run(b, pb.NewExtMcpClient(cc))
	})
	b.Run("countersign", func(b *testing.B) {
		run(b, newAgwWorld(b).agw)
	})
}
