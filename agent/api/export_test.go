package api

import "github.com/countersign/countersign/approval"

// OnPark calls fn each time s parks a long poll (park.go) with true, and
// with false each time a parked poll ends (answered, or its caller gone),
// so tests know when a poll is held without its handler.
func OnPark(s *Server, fn func(parked bool)) { s.onPark = fn }

// Parkable is parkable: whether a long poll may be parked.
var Parkable = parkable

// OnAnswer calls fn with the request id each time a parked poll has
// written its answer (BenchmarkLongPoll: the server's part of the time).
func OnAnswer(s *Server, fn func(id string)) { s.onAnswer = fn }

// OnGone calls fn with the request id each time a long poll sent with
// withdraw_if_gone ends without the decision (gone.go).
func OnGone(s *Server, fn func(id string)) { s.onGone = fn }

// RequestID is s.requestID.
func RequestID(s *Server, caller string, kind approval.Kind, keyHash, callID string) string {
	return s.requestID(caller, kind, keyHash, callID)
}

// LockID locks request id as a call's creation does and returns its unlock.
func LockID(s *Server, id string) func() { return s.creating.lock(id) }

// LockedIDs is how many ids are locked or waited for, and how many hold
// or wait for id.
func LockedIDs(s *Server, id string) (ids, n int) {
	s.creating.mu.Lock()
	defer s.creating.mu.Unlock()
	if k := s.creating.held[id]; k != nil {
		n = k.n
	}
	return len(s.creating.held), n
}
