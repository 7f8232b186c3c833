// Package store keeps Countersign's approval requests in Redis: the durable
// request record (the truth), the per-request wake list that waiting agents
// block on, the deadline and pending indexes, ask-once memory and Slack event
// de-duplication.
//
// Every state change of a request (pending → decided, decided → executing →
// finished) is one Lua script over keys that share a Redis Cluster hash slot
// (the request id is the hash tag), so the first decision wins across any
// number of replicas. Indexes (deadlines, pending, recent per requester) are
// updated by separate commands after the script: they are hints that point at
// records, and readers re-check the record before trusting them.
//
// Waiting is done by a per-Store wake hub: a fixed number of goroutines
// (Options.WaitConns) issue multi-key BLPOP over all waited requests, so the
// number of Redis connections a process holds does not grow with the number
// of waiting agents. See Store.Wait and docs/performance.md.
//
// Refusals are returned as wrapped approval sentinels (approval.ErrNotFound,
// approval.ErrAlreadyDecided, ...); redis.Nil never leaves this package.
package store
