package extauthz

import "testing"

// BenchmarkReadToolCall: reading a forwarded tools/call as a check does
// (the body by exact keys, its params strictly, the arguments compact).
//
//	go test ./agent/extauthz -run '^$' -bench ReadToolCall
func BenchmarkReadToolCall(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":3000001,"method":"tools/call","params":{"name":"lookup","arguments":{"q":"1234"},"_meta":{"reason":"a customer asked"}}}`)
	b.ReportAllocs()
	for b.Loop() {
		m, err := readRPC(body)
		if err != nil {
			b.Fatal(err)
		}
		p, err := ReadCall(m.Params)
		if err != nil || p.Name != "lookup" || p.Reason != "a customer asked" {
			b.Fatalf("ReadCall = %+v, %v", p, err)
		}
		if _, err := Arguments(p.Arguments); err != nil {
			b.Fatal(err)
		}
	}
}
