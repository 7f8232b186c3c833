package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/sashabaranov/go-openai"
)

// Model is the chat completion endpoint the agent talks to. *openai.Client
// satisfies it; so does a client pointed at agent/scripted. An error means
// no reply was received; the agent retries it a bounded number of times.
type Model interface {
	CreateChatCompletion(ctx context.Context, req openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error)
}

var _ Model = (*openai.Client)(nil)

// NewOpenAI returns a go-openai client for any OpenAI-compatible endpoint.
// baseURL is the API root including /v1 (e.g. "https://api.openai.com/v1",
// or an agent/scripted server's URL + "/v1"); empty means OpenAI's.
// httpClient may be nil.
func NewOpenAI(baseURL, apiKey string, httpClient *http.Client) *openai.Client {
	cfg := openai.DefaultConfig(apiKey)
	if baseURL != "" {
		cfg.BaseURL = strings.TrimSuffix(baseURL, "/")
	}
	if httpClient != nil {
		cfg.HTTPClient = httpClient
	}
	return openai.NewClientWithConfig(cfg)
}

// CheckOpenAI checks the settings of the OpenAI-compatible endpoint before
// anything is built: a key is required unless baseURL points at a local
// endpoint, and baseURL, when set, must be an http(s) URL. Each error
// names the environment variable the setting is read from (the OpenAI
// SDKs' names: OPENAI_API_KEY, OPENAI_BASE_URL).
func CheckOpenAI(baseURL, apiKey string) []error {
	var errs []error
	if apiKey == "" && baseURL == "" {
		errs = append(errs, errors.New("OPENAI_API_KEY: required unless OPENAI_BASE_URL points at a local OpenAI-compatible endpoint"))
	}
	if baseURL != "" {
		if u, err := url.Parse(baseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("OPENAI_BASE_URL: not an http(s) URL: %q (want e.g. http://localhost:11434/v1)", baseURL))
		}
	}
	return errs
}

// ModelError says the model could not be reached, or answered nothing
// usable, after every attempt. Nothing was executed for that step.
type ModelError struct {
	Attempts int
	Err      error
}

func (e *ModelError) Error() string {
	return fmt.Sprintf("the model did not answer after %d attempt(s): %v", e.Attempts, e.Err)
}

func (e *ModelError) Unwrap() error { return e.Err }

// complete asks the model, retrying transient failures (network errors,
// 429 and 5xx) up to a.attempts times with doubling backoff from a.backoff,
// slept through the injected sleep function.
func (a *Agent) complete(ctx context.Context, req openai.ChatCompletionRequest) (openai.ChatCompletionMessage, error) {
	var last error
	attempts := 0
	for attempt := 1; attempt <= a.attempts; attempt++ {
		attempts = attempt
		resp, err := a.model.CreateChatCompletion(ctx, req)
		if err == nil {
			if len(resp.Choices) > 0 {
				return resp.Choices[0].Message, nil
			}
			err = errors.New("the reply had no choices")
		}
		last = err
		if ctx.Err() != nil {
			return openai.ChatCompletionMessage{}, ctx.Err()
		}
		if !retryable(err) || attempt == a.attempts {
			break
		}
		a.log.Warn("model call failed, retrying", "attempt", attempt, "err", err)
		if err := a.sleep(ctx, a.backoff<<(attempt-1)); err != nil {
			return openai.ChatCompletionMessage{}, err
		}
	}
	return openai.ChatCompletionMessage{}, &ModelError{Attempts: attempts, Err: last}
}

// retryable reports whether a model error may pass if asked again: rate
// limits, server errors and network failures. Other client errors (a bad
// request, a wrong key) will not.
func retryable(err error) bool {
	var apiErr *openai.APIError
	if errors.As(err, &apiErr) {
		return apiErr.HTTPStatusCode == http.StatusTooManyRequests || apiErr.HTTPStatusCode >= 500 || apiErr.HTTPStatusCode == 0
	}
	var reqErr *openai.RequestError
	if errors.As(err, &reqErr) {
		return reqErr.HTTPStatusCode == http.StatusTooManyRequests || reqErr.HTTPStatusCode >= 500 || reqErr.HTTPStatusCode == 0
	}
	return true
}
