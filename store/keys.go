package store

import (
	"strconv"

	"github.com/countersign/countersign/approval"
)

// Every Redis key the store uses is built here.
//
// Keys that a Lua script touches together share a Redis Cluster hash slot:
// the request record, its wake list and its hint channel (a shard channel,
// which Redis Cluster hashes like a key) all carry the request id as hash
// tag ("{<id>}"). The indexes live in their own slots and are never touched by a
// script, so each script stays within one slot.
//
//	<prefix>:req:{<id>}                              request record (hash, see scripts.go; TTL Options.Retain once final)
//	<prefix>:req:{<id>}:wake                         wake list, one element per final transition (24 h TTL)
//	<prefix>:req:{<id>}:wake:db<N>                   the request's Pub/Sub hint channel (SPUBLISH, same slot;
//	                                                 scripts.go luaHint, wait.go), N the database
//	<prefix>:hub:probe:db<N>                         channel the wake hub probes SPUBLISH support on (wait.go)
//	<prefix>:deployment                              the deployment's secret (deployment.go): 32 random bytes,
//	                                                 set once, never expires
//	<prefix>:deadlines                               ZSET id → deadline (unix ms), pending requests only
//	<prefix>:pending                                 ZSET id → created (unix ms), pending requests only
//	<prefix>:claims                                  ZSET id → end of its claim window (unix ms), approved requests of
//	                                                 outside callers (abandon.go); claimed ones leave it when due
//	<prefix>:recent:{<requester>}                    ZSET id → created (unix ms), last recentKeep requests
//	<prefix>:remember:{<requester>}:<tool>:<digest>  ask-once memory (string, TTL)
//	<prefix>:event:<event id>                        Slack event de-duplication (string, TTL)
//	<prefix>:rate:{<key name>}                       an API key's call budget (hash tokens, at; TTL a minute; ratelimit.go)
//	<prefix>:polls:{<id>}                            long polls begun on a request (integer, TTL an hour; polls.go)
//	<prefix>:grant:{<channel>:<thread_ts>}:<requester>:<tool>  pre-authorisation (JSON approval.Grant, TTL to expiry; grants.go)
//	<prefix>:grants                                  ZSET request id → its grant's expiry (unix ms), for listing (grants.go)
//	<prefix>:stepup:link:<sha256 of token>           a step-up or enrollment link (JSON approval.StepUpLink, TTL to expiry; stepup.go)
//	<prefix>:stepup:session:<sha256 of token>        a passkey registration's ceremony state (bytes, TTL; stepup.go)
//	<prefix>:stepup:fresh:{<user>}                   until when a user's confirmation covers further votes (unix ms, TTL; stepup.go)
//	<prefix>:passkeys:{<user>}                       HASH passkey id → the passkey, as the step-up page keeps it (stepup.go)
//
// Two families are built next to the code that owns them, and listed here
// so this stays the one map of Redis:
//
//	<prefix>:run:{<id>}, :lease, :inbox              durable agent runs (runs.go, runKeys)
//	<prefix>:thread:{<channel>:<thread_ts>}          run of a task thread (runs.go)
//	<prefix>:runs:active                             runs a process may adopt (runs.go)
//	<stream> (default countersign:{audit})           audit stream (audit.go, AuditOptions.Stream)
//	<stream>:head or {<stream>}:head                 audit chain head: seq + hash, same slot (audit.go)
//
// Keys live in one database; Pub/Sub channels do not: a channel is
// server-wide (PUBLISH reaches every database's subscribers, and so does
// SPUBLISH on one node), so two deployments on one server, on different
// databases with the same prefix, would hear each other's hints. Every
// channel name therefore ends in the database number (":db<N>"; a
// Cluster has only database 0), and the prefix is in it already: the
// deployment is named in full.
type keys struct {
	prefix string
	db     int // the client's database (Options.DB), 0 on a Cluster
}

func (k keys) request(id string) string { return k.prefix + ":req:{" + id + "}" }

// wake is request(id) + ":wake", built in one concatenation (one
// allocation: a decision builds it and channel several times).
func (k keys) wake(id string) string { return k.prefix + ":req:{" + id + "}:wake" }

// channel is request id's hint channel: its wake list's name (the same
// hash slot) scoped to the database (wake(id) + dbSuffix(), in one
// concatenation).
func (k keys) channel(id string) string {
	return k.prefix + ":req:{" + id + "}:wake:db" + strconv.Itoa(k.db)
}

func (k keys) hubProbe() string { return k.prefix + ":hub:probe" + k.dbSuffix() }

func (k keys) dbSuffix() string { return ":db" + strconv.Itoa(k.db) }

func (k keys) deployment() string { return k.prefix + ":deployment" }

func (k keys) deadlines() string { return k.prefix + ":deadlines" }

func (k keys) pending() string { return k.prefix + ":pending" }

func (k keys) claims() string { return k.prefix + ":claims" }

func (k keys) recent(requester string) string { return k.prefix + ":recent:{" + requester + "}" }

func (k keys) remember(requester, tool, digest string) string {
	return k.prefix + ":remember:{" + requester + "}:" + tool + ":" + digest
}

func (k keys) event(id string) string { return k.prefix + ":event:" + id }

func (k keys) grants() string { return k.prefix + ":grants" }

func (k keys) stepUpLink(key string) string    { return k.prefix + ":stepup:link:" + key }
func (k keys) stepUpSession(key string) string { return k.prefix + ":stepup:session:" + key }
func (k keys) stepUpFresh(user string) string  { return k.prefix + ":stepup:fresh:{" + user + "}" }
func (k keys) passkeys(user string) string     { return k.prefix + ":passkeys:{" + user + "}" }

func (k keys) grant(o approval.Origin, requester, tool string) string {
	return k.prefix + ":grant:{" + o.Channel + ":" + o.ThreadTS + "}:" + requester + ":" + tool
}
