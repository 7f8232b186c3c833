package bot

import (
	"context"
	"encoding/json"
	"sync"
)

// Drain waits, the bot still running, until every job queued before it
// has run and the card writer has no redraw left: the fuzz targets reuse one bot
// across inputs and compare the state once an input's work is done. It
// queues one barrier per worker; once every worker holds one, each job
// queued earlier has been taken and finished (the queue is FIFO and a
// worker runs one job at a time).
func (b *Bot) Drain(ctx context.Context) error {
	var holding sync.WaitGroup
	holding.Add(b.workers)
	release := make(chan struct{})
	defer close(release)
	for range b.workers {
		if err := b.submit(ctx, func(context.Context) { holding.Done(); <-release }); err != nil {
			return err
		}
	}
	holding.Wait()
	// As Close does: card redraws in back-off (a card the fuzzed input
	// made unreachable) stop after their attempt; then the writer is
	// armed again for the next input.
	b.cards.wait()
	w := b.cards
	w.mu.Lock()
	w.closing = false
	w.backoff, w.stop = context.WithCancel(w.root)
	w.mu.Unlock()
	return nil
}

// SlackOK is slackOK, for TestSlackOKParsing.
var SlackOK = slackOK

// WithoutMessage is withoutMessage, for TestWithoutMessage.
var WithoutMessage = withoutMessage

// WithoutBlocks is withoutBlocks, for TestWithoutBlocks.
var WithoutBlocks = withoutBlocks

// DecodeInteraction decodes an interactive payload as onInteraction does
// after withoutBlocks, or whole (trim false): what the bot reads of it.
func DecodeInteraction(payload []byte, trim bool) (any, error) {
	if trim {
		payload = withoutBlocks(payload)
	}
	var ic interaction
	err := json.Unmarshal(payload, &ic)
	return ic, err
}

// MaxTrim is maxTrim, for TestSlackTransportTrimsEchoes.
const MaxTrim = maxTrim

// Lit, Code and CodeBlock are lit, code and codeBlock, for
// TestLitNeutralisesMarkup.
var (
	Lit       = lit
	Code      = code
	CodeBlock = codeBlock
)
