package bot

// This file: the bot's life. New builds it, Start learns who it is and
// starts the workers, StartSocketMode feeds it, Shutdown and Close stop it.
// It wires every other file; none of them calls back into it.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// New returns a Bot. It does not call Slack; Start does.
func New(opts Options) (*Bot, error) {
	if err := cmp.Or(
		option.Required("bot: Options.Slack", opts.Slack == nil),
		option.Required("bot: Options.Requests", opts.Requests == nil),
		option.Required("bot: Options.Lifecycle", opts.Lifecycle == nil),
		option.Required("bot: Options.Runner", opts.Runner == nil),
		option.Required("bot: Options.Policy", opts.Policy == nil),
	); err != nil {
		return nil, err
	}
	if opts.Policy.Slack.ApprovalsChannel == "" {
		return nil, errors.New("bot: the policy names no approvals channel (slack.approvals_channel)")
	}
	b := &Bot{
		api:          opts.Slack,
		messages:     opts.Slack,
		views:        opts.Slack,
		directory:    opts.Slack,
		records:      opts.Requests,
		home:         opts.Requests,
		dedupe:       opts.Requests,
		lifecycle:    opts.Lifecycle,
		runner:       opts.Runner,
		policy:       opts.Policy,
		now:          opts.Now,
		sleep:        opts.Sleep,
		log:          opts.Logger,
		workers:      opts.Workers,
		secret:       opts.SigningSecret,
		stepUp:       opts.StepUp,
		noted:        map[string]string{},
		waitingNotes: map[string]string{},
		limits:       &rateLimits{until: map[string]time.Time{}},
		http:         opts.HTTPClient,
		bodies:       make(chan struct{}, maxBodies),
	}
	b.http = cmp.Or(b.http, http.DefaultClient)
	b.now = option.FuncOr(b.now, time.Now)
	b.sleep = option.FuncOr(b.sleep, clock.Sleep)
	b.log = cmp.Or(b.log, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.cards = newCardWriter(b.drawCard, b.sleep, b.log, opts.CardWriters, opts.CardSettle)
	b.workers = option.PositiveOr(b.workers, 8)
	ttl := option.PositiveOr(opts.MemberCacheTTL, 30*time.Second)
	b.members = &memberCache{ttl: ttl, now: b.now, entries: map[string]memberEntry{}, drops: map[string]uint64{}}
	b.names = NewNames(b.directory, func() time.Time { return b.now() }, b.log)
	return b, nil
}

// Start calls auth.test to learn the bot's own user and bot ids, and starts
// the worker pool. Work runs with ctx (or a context derived from it), so
// cancelling ctx stops work in progress; Close drains the pool.
func (b *Bot) Start(ctx context.Context) error {
	var res *slack.AuthTestResponse
	err := b.retry(ctx, "auth.test", func(ctx context.Context) error {
		var err error
		res, err = b.api.AuthTestContext(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("slack auth.test: %w", err)
	}
	b.queueMu.Lock()
	defer b.queueMu.Unlock()
	if b.started {
		return errors.New("bot: already started")
	}
	if b.closed {
		return errors.New("bot: closed")
	}
	b.self.Store(&identity{UserID: res.UserID, BotID: res.BotID, TeamID: res.TeamID, EnterpriseID: res.EnterpriseID, URL: res.URL})
	b.cards.start(ctx)
	b.started = true
	b.jobs = make(chan func(context.Context), 256)
	for range b.workers {
		b.wg.Add(1)
		// Each worker exits when Close closes jobs and the queue is empty.
		go func() {
			defer b.wg.Done()
			for job := range b.jobs {
				b.runJob(ctx, job)
			}
		}()
	}
	b.log.Info("slack bot started", "bot_user", res.UserID, "bot_id", res.BotID, "team", res.TeamID)
	return nil
}

func (b *Bot) runJob(ctx context.Context, job func(context.Context)) {
	defer func() {
		if p := recover(); p != nil {
			b.log.Error("panic in slack job", "panic", fmt.Sprint(p))
		}
	}()
	job(ctx)
}

// Close stops accepting work and waits for queued and running work to
// finish. It is safe to call more than once.
func (b *Bot) Close() error {
	b.queueMu.Lock()
	if b.closed {
		b.queueMu.Unlock()
		return nil
	}
	b.closed = true
	if b.jobs != nil {
		close(b.jobs)
	}
	b.queueMu.Unlock()
	b.wg.Wait()
	b.cards.wait()
	return nil
}

// StartSocketMode serves Socket Mode envelopes from client (RunSocketMode)
// in a goroutine until Shutdown, or until ctx ends. A connection that
// fails for good is logged. Call it at most once, after Start.
func (b *Bot) StartSocketMode(ctx context.Context, client *socketmode.Client) {
	intake, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	b.intakeMu.Lock()
	b.stopIntake, b.intakeDone = stop, done
	b.intakeMu.Unlock()
	go func() { // exits when Shutdown calls stopIntake (or ctx ends)
		defer close(done)
		if err := b.RunSocketMode(intake, client); err != nil && intake.Err() == nil {
			b.log.Error("socket mode stopped", "err", err)
		}
	}()
}

// Shutdown is the bot's part of a process's graceful stop, after the HTTP
// server stopped taking requests: it stops Socket Mode intake (the
// envelopes in hand are still acked), then finishes the Slack work already
// queued, card updates after clicks included (Close). It gives up when
// ctx ends; the caller then cancels the context the bot was started with,
// which cancels the work still running.
func (b *Bot) Shutdown(ctx context.Context) error {
	var errs []error
	b.intakeMu.Lock()
	stop, intakeDone := b.stopIntake, b.intakeDone
	b.intakeMu.Unlock()
	if stop != nil {
		stop()
		select {
		case <-intakeDone:
		case <-ctx.Done():
			errs = append(errs, errors.New("socket mode still running at shutdown"))
		}
	}
	done := make(chan error, 1)
	go func() { done <- b.Close() }() // returns once the pool is drained
	select {
	case err := <-done:
		errs = append(errs, err)
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("slack work still running at shutdown: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}
