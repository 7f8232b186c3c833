package api

// OnPark calls fn each time s parks a long poll (park.go) with true, and
// with false each time a parked poll ends (answered, or its caller gone),
// so tests know when a poll is held without its handler.
func OnPark(s *Server, fn func(parked bool)) { s.onPark = fn }

// Parkable is parkable: whether a long poll may be parked.
var Parkable = parkable
